//! A JSON tree to read, edit and write back the `config.json` files of the fixtures, written
//! here so that the tests do not lean on the crate's own reader. Include it from a test crate
//! with `#[path = "common/json_edit.rs"] mod json_edit;`. It reads what the fixtures hold
//! (objects, arrays, strings without escapes other than `\"` and `\\`, numbers, literals)
//! and keeps numbers as written.
#![allow(dead_code)]

/// One JSON value; numbers as their text, objects as their members in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// A literal, number or other token written as is: `null`, `true`, `1e-300`, `NaN`.
    Raw(String),
    /// A string (unescaped).
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// The value of `text`; panics on anything the fixtures do not hold.
    pub fn parse(text: &str) -> Json {
        let mut chars: Vec<char> = text.chars().collect();
        chars.retain(|c| !matches!(c, '\n' | '\r' | '\t'));
        let (value, rest) = value(&chars);
        assert!(rest.iter().all(|c| *c == ' '), "trailing text");
        value
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The member `key` of an object, to edit.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Obj(members) => members.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Sets member `key` of an object to `value` (added at the end when absent), or removes it
    /// (`None`).
    pub fn set(&mut self, key: &str, value: Option<Json>) {
        let Json::Obj(members) = self else {
            panic!("set on a non-object");
        };
        let at = members.iter().position(|(k, _)| k == key);
        match (at, value) {
            (Some(i), Some(v)) => members[i].1 = v,
            (Some(i), None) => {
                members.remove(i);
            }
            (None, Some(v)) => members.push((key.to_string(), v)),
            (None, None) => {}
        }
    }

    /// The keys of an object.
    pub fn keys(&self) -> Vec<String> {
        match self {
            Json::Obj(members) => members.iter().map(|(k, _)| k.clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// The text of the value.
    pub fn write(&self) -> String {
        match self {
            Json::Raw(t) => t.clone(),
            Json::Str(s) => quote(s),
            Json::Arr(items) => {
                let items: Vec<String> = items.iter().map(Json::write).collect();
                format!("[{}]", items.join(", "))
            }
            Json::Obj(members) => {
                let members: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}: {}", quote(k), v.write()))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
        }
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn skip_spaces(mut s: &[char]) -> &[char] {
    while let [' ', rest @ ..] = s {
        s = rest;
    }
    s
}

/// The value at the start of `s` and the text after it.
fn value(s: &[char]) -> (Json, &[char]) {
    let s = skip_spaces(s);
    match s.first() {
        Some('"') => {
            let (text, rest) = string(s);
            (Json::Str(text), rest)
        }
        Some('[') => {
            let mut items = Vec::new();
            let mut rest = skip_spaces(&s[1..]);
            while rest.first() != Some(&']') {
                let (item, after) = value(rest);
                items.push(item);
                rest = skip_spaces(after);
                if rest.first() == Some(&',') {
                    rest = &rest[1..];
                }
            }
            (Json::Arr(items), &rest[1..])
        }
        Some('{') => {
            let mut members = Vec::new();
            let mut rest = skip_spaces(&s[1..]);
            while rest.first() != Some(&'}') {
                let (key, after) = string(rest);
                let after = skip_spaces(after);
                assert_eq!(after.first(), Some(&':'), "a key without a colon");
                let (item, after) = value(&after[1..]);
                members.push((key, item));
                rest = skip_spaces(after);
                if rest.first() == Some(&',') {
                    rest = skip_spaces(&rest[1..]);
                }
            }
            (Json::Obj(members), &rest[1..])
        }
        _ => {
            let end = s
                .iter()
                .position(|c| matches!(c, ',' | ']' | '}' | ' '))
                .unwrap_or(s.len());
            (Json::Raw(s[..end].iter().collect()), &s[end..])
        }
    }
}

/// The string starting at the quote `s[0]`, unescaped, and the text after it.
fn string(s: &[char]) -> (String, &[char]) {
    assert_eq!(s.first(), Some(&'"'), "a string");
    let mut out = String::new();
    let mut i = 1;
    while s[i] != '"' {
        if s[i] == '\\' {
            i += 1;
        }
        out.push(s[i]);
        i += 1;
    }
    (out, &s[i + 1..])
}
