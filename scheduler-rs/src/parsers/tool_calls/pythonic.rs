//! Pythonic calls (Llama 3.2/4 and others): the whole reply is a Python list of calls with
//! keyword arguments, `[get_weather(city="Oslo"), now()]`, optionally within
//! `<|python_start|>`/`<|python_end|>`. Argument values are Python literals: strings,
//! numbers, `True`/`False`/`None`, lists, tuples and dicts (read as JSON).

use serde_json::{Map, Value};

use super::call::ToolCall;

/// (content, calls): ("", calls) when the whole reply is a list of calls. None when it
/// starts like one but does not parse as one.
pub(super) fn parse(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("<|python_start|>")
        .map(|t| t.trim_end().trim_end_matches("<|python_end|>").trim())
        .unwrap_or(trimmed);
    if !inner.starts_with('[') {
        return Some((trimmed.to_string(), Vec::new()));
    }
    let mut p = Reader {
        s: inner.as_bytes(),
        at: 0,
    };
    let calls = p.calls()?;
    p.ws();
    (p.at == p.s.len() && !calls.is_empty()).then_some((String::new(), calls))
}

/// Calls written as a Python list.
pub(super) fn write(calls: &[ToolCall]) -> String {
    let one = |c: &ToolCall| {
        let args = match serde_json::from_str::<Value>(&c.arguments) {
            Ok(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| format!("{k}={}", literal(v)))
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        };
        format!("{}({args})", c.name)
    };
    format!("[{}]", calls.iter().map(one).collect::<Vec<_>>().join(", "))
}

/// A JSON value as a Python literal.
fn literal(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(_) | Value::String(_) => v.to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A recursive-descent reader over the reply's bytes.
struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// Skip whitespace, then take `c` if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.peek() == Some(c);
        self.at += usize::from(hit);
        hit
    }

    /// Items until `close`, separated by commas (a trailing comma allowed).
    fn items<T>(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut out = Vec::new();
        loop {
            if self.eat(close) {
                return Some(out);
            }
            out.push(item(self)?);
            if !self.eat(b',') {
                return self.eat(close).then_some(out);
            }
        }
    }

    fn calls(&mut self) -> Option<Vec<ToolCall>> {
        if !self.eat(b'[') {
            return None;
        }
        self.items(b']', Self::call)
    }

    fn name(&mut self, dots: bool) -> Option<String> {
        self.ws();
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || (dots && c == b'.'))
        {
            self.at += 1;
        }
        let name = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        let first = name.bytes().next()?;
        (!first.is_ascii_digit()).then(|| name.to_string())
    }

    fn call(&mut self) -> Option<ToolCall> {
        let name = self.name(true)?;
        if !self.eat(b'(') {
            return None;
        }
        let args = self.items(b')', |r| {
            let key = r.name(false)?;
            r.eat(b'=').then_some(())?;
            Some((key, r.value()?))
        })?;
        let args: Map<String, Value> = args.into_iter().collect();
        Some(ToolCall {
            name,
            arguments: Value::Object(args).to_string(),
        })
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        match self.peek()? {
            b'[' => {
                self.at += 1;
                self.items(b']', Self::value).map(Value::Array)
            }
            b'(' => {
                self.at += 1;
                self.items(b')', Self::value).map(Value::Array)
            }
            b'{' => {
                self.at += 1;
                let pairs = self.items(b'}', |r| {
                    let Value::String(k) = r.value()? else {
                        return None;
                    };
                    r.eat(b':').then_some(())?;
                    Some((k, r.value()?))
                })?;
                Some(Value::Object(pairs.into_iter().collect()))
            }
            q @ (b'"' | b'\'') => self.string(q).map(Value::String),
            _ => self.word(),
        }
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self, quote: u8) -> Option<String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let c = self.peek()?;
            self.at += 1;
            match c {
                _ if c == quote => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = self.peek()?;
                    self.at += 1;
                    let ch = match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'0' => '\0',
                        b'u' => {
                            let hex = self.s.get(self.at..self.at + 4)?;
                            self.at += 4;
                            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16);
                            char::from_u32(code.ok()?)?
                        }
                        other => char::from(other),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(c),
            }
        }
    }

    /// `True`, `False`, `None` or a number.
    fn word(&mut self) -> Option<Value> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || b"+-._".contains(&c))
        {
            self.at += 1;
        }
        match std::str::from_utf8(&self.s[start..self.at]).ok()? {
            "True" => Some(Value::Bool(true)),
            "False" => Some(Value::Bool(false)),
            "None" => Some(Value::Null),
            number => serde_json::from_str::<serde_json::Number>(number)
                .ok()
                .map(Value::Number),
        }
    }
}
