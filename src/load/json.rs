//! A minimal JSON reader, shared by the safetensors header and `config.json`.
//!
//! At its core is a cursor over the text rather than a tree builder: the header reader asks for
//! the value it expects next (an object, a string, an integer) and skips values it does not
//! need, so memory stays proportional to the tensors described. [`parse`] builds a [`Value`]
//! tree on the same cursor, for small documents read as a whole (`config.json`). Everything in RFC 8259 is
//! accepted — whitespace anywhere between tokens, every escape (`\" \\ \/ \b \f \n \r \t
//! \uXXXX`, surrogate pairs joined) — and everything else is an error with its byte position:
//! raw control characters in strings, lone surrogates, leading zeros, trailing commas.
//! Arrays and objects may nest at most [`MAX_DEPTH`] deep, so no input can exhaust the stack.

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;

/// The deepest nesting of arrays and objects accepted. A safetensors header needs 3
/// (header → tensor → shape); anything deeper can only appear in values that are skipped.
pub const MAX_DEPTH: usize = 64;

/// The JSON type of the next value, for "expected …, found …" messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl Kind {
    /// The name used in error messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// Why a text is not JSON, or could not be held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonError {
    /// Bad syntax (or nesting too deep) at byte `position`.
    Syntax {
        position: usize,
        reason: &'static str,
    },
    /// Memory for a string or a container starting at byte `position` ran out.
    AllocationFailed { position: usize, bytes: usize },
}

type Result<T> = core::result::Result<T, JsonError>;

/// A position in a JSON text.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

/// Positioning and structure: whitespace, objects, arrays, and skipping values.
impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }

    /// A syntax error at the current position.
    pub(crate) fn error(&self, reason: &'static str) -> JsonError {
        JsonError::Syntax {
            position: self.pos,
            reason,
        }
    }

    fn peek_byte(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek_byte() {
            self.pos += 1;
        }
    }

    /// Skips whitespace and tells whether the text ends there.
    pub(crate) fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos >= self.text.len()
    }

    /// Skips whitespace and classifies the next value by its first byte.
    pub(crate) fn peek_kind(&mut self) -> Result<Kind> {
        self.skip_ws();
        match self.peek_byte() {
            Some(b'{') => Ok(Kind::Object),
            Some(b'[') => Ok(Kind::Array),
            Some(b'"') => Ok(Kind::String),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b't' | b'f') => Ok(Kind::Bool),
            Some(b'n') => Ok(Kind::Null),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of JSON, expected a value")),
        }
    }

    /// Skips whitespace; consumes `byte` if it comes next.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        if self.peek_byte() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Skips whitespace and consumes `byte`, or fails with `reason`.
    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<()> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    fn check_depth(&self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            // The message spells out MAX_DEPTH (checked below).
            const _: () = assert!(MAX_DEPTH == 64);
            Err(self.error("arrays and objects nested more than 64 deep"))
        } else {
            Ok(())
        }
    }

    /// Reads an object whose nesting depth is `depth` (the header itself is 1), calling
    /// `member(cursor, key)` with the cursor before each member's value; the callback must
    /// consume that value.
    pub(crate) fn object<E: From<JsonError>>(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, String) -> core::result::Result<(), E>,
    ) -> core::result::Result<(), E> {
        self.check_depth(depth)?;
        self.expect(b'{', "expected '{'")?;
        if self.eat(b'}') {
            return Ok(());
        }
        loop {
            self.skip_ws();
            match self.peek_byte() {
                Some(b'"') => {}
                Some(_) => return Err(self.error("expected a string key").into()),
                None => {
                    return Err(self
                        .error("unexpected end of JSON, expected a string key")
                        .into())
                }
            }
            let key = self.string()?;
            self.expect(b':', "expected ':' after an object key")?;
            member(self, key)?;
            if self.eat(b'}') {
                return Ok(());
            }
            self.expect(b',', "expected ',' or '}' after an object member")?;
        }
    }

    /// Reads an array whose nesting depth is `depth`, calling `element(cursor)` before each
    /// element; the callback must consume it.
    pub(crate) fn array<E: From<JsonError>>(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self) -> core::result::Result<(), E>,
    ) -> core::result::Result<(), E> {
        self.check_depth(depth)?;
        self.expect(b'[', "expected '['")?;
        if self.eat(b']') {
            return Ok(());
        }
        loop {
            element(self)?;
            if self.eat(b']') {
                return Ok(());
            }
            self.expect(b',', "expected ',' or ']' after an array element")?;
        }
    }

    /// Skips one value of any type; `depth` is the depth an array or object there would have.
    pub(crate) fn skip_value(&mut self, depth: usize) -> Result<()> {
        match self.peek_kind()? {
            Kind::Object => self.object(depth, |c, _| c.skip_value(depth + 1)),
            Kind::Array => self.array(depth, |c| c.skip_value(depth + 1)),
            Kind::String => self.string().map(drop),
            Kind::Number => self.number().map(drop),
            Kind::Bool | Kind::Null => self.literal().map(drop),
        }
    }
}

/// Scalars: literals, numbers and strings.
impl<'a> Cursor<'a> {
    /// Reads `true`, `false` or `null`, as `Some(true)`, `Some(false)` or `None`.
    pub(crate) fn literal(&mut self) -> Result<Option<bool>> {
        self.skip_ws();
        let rest = self.text.as_bytes().get(self.pos..).unwrap_or_default();
        for (word, value) in [("true", Some(true)), ("false", Some(false)), ("null", None)] {
            if rest.starts_with(word.as_bytes()) {
                self.pos += word.len();
                return Ok(value);
            }
        }
        Err(self.error("expected true, false or null"))
    }

    /// Reads a number token, checking the JSON grammar
    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, and returns its text.
    pub(crate) fn number(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let start = self.pos;
        if self.peek_byte() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek_byte() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek_byte() {
                    return Err(self.error("leading zeros are not allowed in numbers"));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("expected a digit")),
        }
        if self.peek_byte() == Some(b'.') {
            self.pos += 1;
            self.require_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek_byte() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek_byte() {
                self.pos += 1;
            }
            self.require_digits()?;
        }
        // The token is ASCII, so both ends are character boundaries.
        self.text
            .get(start..self.pos)
            .ok_or_else(|| self.error("number is not ASCII"))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek_byte() {
            self.pos += 1;
        }
    }

    fn require_digits(&mut self) -> Result<()> {
        match self.peek_byte() {
            Some(b'0'..=b'9') => {
                self.digits();
                Ok(())
            }
            _ => Err(self.error("expected a digit")),
        }
    }

    /// Reads a string, resolving escapes. The cursor must be at the opening quote (after
    /// whitespace).
    pub(crate) fn string(&mut self) -> Result<String> {
        self.expect(b'"', "expected '\"'")?;
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote, backslash or control character in one go.
            let run_start = self.pos;
            while let Some(b) = self.peek_byte() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Both ends sit before an ASCII byte (or at the end), so they are char boundaries.
            let run = self
                .text
                .get(run_start..self.pos)
                .ok_or_else(|| self.error("string is not UTF-8"))?;
            out.try_reserve(run.len())
                .map_err(|_| JsonError::AllocationFailed {
                    position: run_start,
                    bytes: run.len(),
                })?;
            out.push_str(run);
            match self.peek_byte() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self.escape()?;
                    out.push(c);
                }
                Some(_) => return Err(self.error("control character in a string must be escaped")),
            }
        }
    }

    /// Reads the escape after a backslash.
    fn escape(&mut self) -> Result<char> {
        let Some(b) = self.peek_byte() else {
            return Err(self.error("unterminated escape"));
        };
        self.pos += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => self.unicode_escape()?,
            _ => {
                self.pos -= 1;
                return Err(self.error("invalid escape"));
            }
        })
    }

    /// Reads the `XXXX` of a `\uXXXX` escape, and the second escape of a surrogate pair.
    fn unicode_escape(&mut self) -> Result<char> {
        let first = self.hex4()?;
        match first {
            0xd800..=0xdbff => {
                // A high surrogate must be followed by an escaped low surrogate.
                let rest = self.text.as_bytes().get(self.pos..).unwrap_or_default();
                if !rest.starts_with(b"\\u") {
                    return Err(self.error("lone leading surrogate in \\u escape"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(self.error("leading surrogate not followed by a trailing one"));
                }
                let code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
                char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))
            }
            0xdc00..=0xdfff => Err(self.error("lone trailing surrogate in \\u escape")),
            _ => char::from_u32(first).ok_or_else(|| self.error("invalid \\u escape")),
        }
    }

    /// Reads four hex digits.
    fn hex4(&mut self) -> Result<u32> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = match self.peek_byte() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(self.error("expected four hex digits after \\u")),
            };
            value = value * 16 + u32::from(digit);
            self.pos += 1;
        }
        Ok(value)
    }
}

/// A JSON value read whole by [`parse`]. Numbers keep their text (checked against the JSON
/// grammar), so a reader can take them as exact integers or as `f64`: borrowed from the parsed
/// text, or copied by [`into_owned`](Self::into_owned) for a tree kept after it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    Null,
    Bool(bool),
    Number(Cow<'a, str>),
    String(String),
    Array(Vec<Value<'a>>),
    /// Members in text order; a key may appear more than once (readers decide).
    Object(Vec<(String, Value<'a>)>),
}

#[cfg(feature = "std")] // for the config a `Checkpoint` keeps
impl Value<'_> {
    /// The same value, its numbers' text copied: a tree that borrows nothing.
    pub(crate) fn into_owned(self) -> Value<'static> {
        match self {
            Value::Null => Value::Null,
            Value::Bool(b) => Value::Bool(b),
            Value::Number(text) => Value::Number(Cow::Owned(text.into_owned())),
            Value::String(s) => Value::String(s),
            Value::Array(items) => Value::Array(items.into_iter().map(Value::into_owned).collect()),
            Value::Object(members) => Value::Object(
                (members.into_iter())
                    .map(|(key, value)| (key, value.into_owned()))
                    .collect(),
            ),
        }
    }
}

/// Parses `text` as one JSON value, with whitespace around it, arrays and objects nested at
/// most [`MAX_DEPTH`] deep.
pub(crate) fn parse(text: &str) -> Result<Value<'_>> {
    let mut c = Cursor::new(text);
    let value = c.value(1)?;
    if !c.at_end() {
        return Err(c.error("unexpected content after the JSON value"));
    }
    Ok(value)
}

/// Building [`Value`] trees.
impl<'a> Cursor<'a> {
    /// Reads one value; `depth` is the depth an array or object there has.
    fn value(&mut self, depth: usize) -> Result<Value<'a>> {
        Ok(match self.peek_kind()? {
            Kind::Object => {
                let mut members = Vec::new();
                self.object(depth, |c, key| {
                    let value = c.value(depth + 1)?;
                    c.push(&mut members, (key, value))
                })?;
                Value::Object(members)
            }
            Kind::Array => {
                let mut items = Vec::new();
                self.array(depth, |c| {
                    let value = c.value(depth + 1)?;
                    c.push(&mut items, value)
                })?;
                Value::Array(items)
            }
            Kind::String => Value::String(self.string()?),
            Kind::Number => Value::Number(Cow::Borrowed(self.number()?)),
            Kind::Bool | Kind::Null => self.literal()?.map_or(Value::Null, Value::Bool),
        })
    }

    /// Appends `item`, failing instead of aborting when memory runs out.
    fn push<T>(&self, items: &mut Vec<T>, item: T) -> Result<()> {
        items
            .try_reserve(1)
            .map_err(|_| JsonError::AllocationFailed {
                position: self.pos,
                bytes: core::mem::size_of::<T>(),
            })?;
        items.push(item);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, JsonError, Value, MAX_DEPTH};
    use alloc::string::String;
    use alloc::vec;
    use alloc::vec::Vec;

    fn syntax(text: &str) -> (usize, &'static str) {
        match parse(text) {
            Err(JsonError::Syntax { position, reason }) => (position, reason),
            other => panic!("{text:?} gave {other:?}"),
        }
    }

    fn string(s: &str) -> Value<'static> {
        Value::String(String::from(s))
    }

    #[test]
    fn values_of_every_kind() {
        let text = " {\"a\": [1, -2.5e3, true, false, null], \"b\": {\"c\": \"d\"}, \"a\": {}} ";
        let expected = Value::Object(vec![
            (
                String::from("a"),
                Value::Array(vec![
                    Value::Number("1".into()),
                    Value::Number("-2.5e3".into()),
                    Value::Bool(true),
                    Value::Bool(false),
                    Value::Null,
                ]),
            ),
            (
                String::from("b"),
                Value::Object(vec![(String::from("c"), string("d"))]),
            ),
            // Repeated keys are kept, in order, for the reader to judge.
            (String::from("a"), Value::Object(Vec::new())),
        ]);
        assert_eq!(parse(text), Ok(expected));
        assert_eq!(parse("[]"), Ok(Value::Array(Vec::new())));
        assert_eq!(parse("\t0\r\n"), Ok(Value::Number("0".into())));
    }

    #[test]
    fn escapes_are_resolved() {
        let text = r#""q\" b\\ s\/ \b\f\n\r\t \u00e9 \ud83d\ude00 \u20AC""#;
        let expected = "q\" b\\ s/ \u{8}\u{c}\n\r\t é 😀 €";
        assert_eq!(parse(text), Ok(string(expected)));
        assert_eq!(parse("\"ü raw UTF-8\""), Ok(string("ü raw UTF-8")));
    }

    #[test]
    fn numbers_follow_the_grammar() {
        for ok in ["0", "-0", "12", "1.5", "1e5", "1E+5", "2.5e-3", "-0.0"] {
            assert_eq!(parse(ok), Ok(Value::Number(ok.into())), "{ok}");
        }
        assert_eq!(
            syntax("01"),
            (1, "leading zeros are not allowed in numbers")
        );
        assert_eq!(syntax("1."), (2, "expected a digit"));
        assert_eq!(syntax("-"), (1, "expected a digit"));
        assert_eq!(syntax("1e"), (2, "expected a digit"));
        assert_eq!(syntax(".5"), (0, "expected a value"));
        assert_eq!(syntax("+1"), (0, "expected a value"));
    }

    #[test]
    fn nesting_is_limited() {
        let nested = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(
            syntax(&nested(MAX_DEPTH + 1)),
            (MAX_DEPTH, "arrays and objects nested more than 64 deep")
        );
        let objects = "{\"a\":".repeat(MAX_DEPTH + 1) + "1" + &"}".repeat(MAX_DEPTH + 1);
        assert_eq!(
            syntax(&objects).1,
            "arrays and objects nested more than 64 deep"
        );
        // Deep nesting far past the limit fails the same way, without exhausting the stack.
        assert_eq!(syntax(&nested(100_000)).0, MAX_DEPTH);
    }

    #[test]
    fn errors_name_their_position() {
        let cases: [(&str, usize, &str); 13] = [
            ("", 0, "unexpected end of JSON, expected a value"),
            ("   ", 3, "unexpected end of JSON, expected a value"),
            ("[1,]", 3, "expected a value"),
            ("{\"a\":1,}", 7, "expected a string key"),
            ("{\"a\" 1}", 5, "expected ':' after an object key"),
            ("{\"a\":1", 6, "expected ',' or '}' after an object member"),
            ("[1 2]", 3, "expected ',' or ']' after an array element"),
            ("\"abc", 4, "unterminated string"),
            (
                "\"a\nb\"",
                2,
                "control character in a string must be escaped",
            ),
            ("\"\\x\"", 2, "invalid escape"),
            ("\"\\ud800\"", 7, "lone leading surrogate in \\u escape"),
            ("\"\\udc00\"", 7, "lone trailing surrogate in \\u escape"),
            ("{} x", 3, "unexpected content after the JSON value"),
        ];
        for (text, position, reason) in cases {
            assert_eq!(syntax(text), (position, reason), "{text:?}");
        }
        assert_eq!(syntax("tru").1, "expected true, false or null");
        assert_eq!(
            syntax("\"\\u12G4\"").1,
            "expected four hex digits after \\u"
        );
    }
}
