//! Typed look-ups in a parsed `config.json`, with the key path kept for error messages.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;

use super::ConfigError;
use crate::load::json::Value;

type Result<T> = core::result::Result<T, ConfigError>;

/// `value` as written, for error messages: numbers and literals verbatim, strings quoted,
/// containers by kind; long texts cut at 40 characters.
pub(super) fn describe(value: &Value<'_>) -> String {
    let text = match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(t) => String::from(&**t),
        Value::String(s) => format!("\"{s}\""),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    };
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// One object of the file and the path of keys that leads to it (empty for the top level).
pub(super) struct Obj<'v, 'a> {
    members: &'v [(String, Value<'a>)],
    path: String,
}

impl<'v, 'a> Obj<'v, 'a> {
    /// The top-level object of a parsed file.
    pub(super) fn root(value: &'v Value<'a>) -> Result<Self> {
        match value {
            Value::Object(members) => Ok(Obj {
                members,
                path: String::new(),
            }),
            other => Err(ConfigError::WrongType {
                key: String::new(),
                expected: "a JSON object",
                found: describe(other),
            }),
        }
    }

    /// The full path of `key` in this object.
    pub(super) fn key(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value of `key`, `null` included; `None` when absent.
    pub(super) fn raw(&self, key: &str) -> Result<Option<&'v Value<'a>>> {
        let mut found = self.members.iter().filter(|(k, _)| k == key);
        let first = found.next().map(|(_, v)| v);
        if found.next().is_some() {
            return Err(ConfigError::DuplicateKey { key: self.key(key) });
        }
        Ok(first)
    }

    /// The value of `key`; `None` when absent or `null`.
    pub(super) fn get(&self, key: &str) -> Result<Option<&'v Value<'a>>> {
        Ok(self.raw(key)?.filter(|v| **v != Value::Null))
    }

    fn wrong(&self, key: &str, expected: &'static str, found: &Value<'_>) -> ConfigError {
        ConfigError::WrongType {
            key: self.key(key),
            expected,
            found: describe(found),
        }
    }

    /// A non-negative integer written without fraction or exponent, that fits in `usize`.
    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        match v {
            Value::Number(t) if t.bytes().all(|b| b.is_ascii_digit()) => {
                t.parse().map(Some).map_err(|_| {
                    let reason = format!("is more than the largest size, {}", usize::MAX);
                    ConfigError::invalid(self.key(key), describe(v), reason)
                })
            }
            _ => Err(self.wrong(key, "a non-negative integer", v)),
        }
    }

    /// A number within the range of `f64`.
    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        match v {
            Value::Number(t) => match t.parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(ConfigError::invalid(
                    self.key(key),
                    describe(v),
                    "is beyond the range of a 64-bit float",
                )),
            },
            _ => Err(self.wrong(key, "a number", v)),
        }
    }

    /// The value of `key` as written, for messages (empty when absent).
    pub(super) fn written(&self, key: &str) -> String {
        match self.raw(key) {
            Ok(Some(v)) => describe(v),
            _ => String::new(),
        }
    }

    /// A boolean. `null` is an error, as in `transformers` v5 (whose configuration classes
    /// check types); older versions read it as false, so it has no one meaning.
    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.raw(key)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "true or false", v)),
        }
    }

    /// A string.
    pub(super) fn str(&self, key: &str) -> Result<Option<&'v str>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// An array.
    pub(super) fn array(&self, key: &str) -> Result<Option<&'v [Value<'a>]>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    /// A nested object, its path extended by `key`.
    pub(super) fn object(&self, key: &str) -> Result<Option<Obj<'v, 'a>>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::Object(members)) => Ok(Some(Obj {
                members,
                path: self.key(key),
            })),
            Some(v) => Err(self.wrong(key, "an object", v)),
        }
    }

    /// Whether the object has no members.
    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The object's keys, in text order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &'v str> {
        self.members.iter().map(|(k, _)| k.as_str())
    }

    /// Whether any key of the object is one of `keys`.
    pub(super) fn has_any(&self, keys: &[&str]) -> bool {
        self.members.iter().any(|(k, _)| keys.contains(&k.as_str()))
    }
}

/// `value`, or [`ConfigError::Missing`] naming `key`.
pub(super) fn required<T>(obj: &Obj<'_, '_>, key: &str, value: Option<T>) -> Result<T> {
    value.ok_or_else(|| ConfigError::Missing { key: obj.key(key) })
}

/// The range a number must be in once converted to the type the layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Range {
    /// Finite and above zero.
    Positive,
    /// Finite and not negative.
    NonNegative,
    /// Finite.
    Finite,
}

impl Range {
    /// Whether `x` is in the range.
    pub(super) fn holds(self, x: f64) -> bool {
        x.is_finite()
            && match self {
                Range::Positive => x > 0.0,
                Range::NonNegative => x >= 0.0,
                Range::Finite => true,
            }
    }

    /// The range, for messages.
    pub(super) fn text(self) -> &'static str {
        match self {
            Range::Positive => "finite and > 0",
            Range::NonNegative => "finite and >= 0",
            Range::Finite => "finite",
        }
    }
}

/// `value`, what the layer takes from `key` of `obj` (`what`, e.g. `"the softmax scale"`),
/// converted to the layer's `f32`, or [`ConfigError::Invalid`] naming the key, its value as
/// written and the `f32` it became when that is not in `range`.
pub(super) fn layer_f32(
    obj: &Obj<'_, '_>,
    key: &str,
    what: &str,
    value: f64,
    range: Range,
) -> Result<f32> {
    let converted = value as f32;
    if range.holds(f64::from(converted)) {
        return Ok(converted);
    }
    let reason = format!(
        "gives {what} {converted:?} in f32, which must be {}",
        range.text()
    );
    Err(ConfigError::invalid(obj.key(key), obj.written(key), reason))
}
