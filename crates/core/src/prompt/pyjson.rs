//! JSON text exactly as Python's `json.dumps(x, ensure_ascii=False, …)` writes it, which is what
//! Hugging Face's `tojson` template filter produces. Token counts depend on every byte: the default
//! minijinja filter HTML-escapes and serde_json's compact form has no spaces after `,` and `:`.

use serde_json::ser::{CharEscape, Formatter};
use std::io::{self, Write};

/// `json.dumps` options that HF's `tojson(x, ensure_ascii, indent, separators, sort_keys)` exposes.
#[derive(Clone, Debug)]
pub(crate) struct DumpOptions {
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            indent: None,
            item_sep: ", ".to_owned(),
            key_sep: ": ".to_owned(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

impl DumpOptions {
    /// Python's rule: with an indent the default item separator loses its trailing space.
    pub fn with_indent(mut self, indent: Option<String>) -> Self {
        if indent.is_some() {
            self.item_sep = ",".to_owned();
        }
        self.indent = indent;
        self
    }
}

/// Serialises `value` the way `json.dumps` does with `opts`.
pub(crate) fn dumps(value: &serde_json::Value, opts: &DumpOptions) -> Result<String, serde_json::Error> {
    let mut out = Vec::with_capacity(128);
    let formatter = PyFormatter { opts, depth: 0, has_value: false };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    if opts.sort_keys {
        serde::Serialize::serialize(&sorted(value), &mut ser)?;
    } else {
        serde::Serialize::serialize(value, &mut ser)?;
    }
    // The formatter only ever writes UTF-8 (strings come from `&str`, the rest is ASCII).
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

/// A copy with every object's keys in sorted (code point) order, as `sort_keys=True` does.
fn sorted(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

struct PyFormatter<'a> {
    opts: &'a DumpOptions,
    depth: usize,
    has_value: bool,
}

impl PyFormatter<'_> {
    fn newline_indent<W: ?Sized + Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.opts.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }
}

impl Formatter for PyFormatter<'_> {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(python_float_repr(f64::from(value)).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        if !self.opts.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        let mut buf = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut buf) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }

    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, escape: CharEscape) -> io::Result<()> {
        // Same short escapes as Python; other control characters as lower-case \u00XX.
        let s: &[u8] = match escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            CharEscape::Solidus => b"/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(byte) => return write!(w, "\\u{byte:04x}"),
        };
        w.write_all(s)
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline_indent(w)?;
        }
        self.has_value = true;
        w.write_all(b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.opts.item_sep.as_bytes())?;
        }
        self.newline_indent(w)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline_indent(w)?;
        }
        self.has_value = true;
        w.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.opts.item_sep.as_bytes())?;
        }
        self.newline_indent(w)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.opts.key_sep.as_bytes())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for decimal exponents in
/// [-4, 16), scientific (`1e+20`, `1e-05`) outside it, and always a `.0` on integral values.
pub(crate) fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value < 0.0 { "-Infinity" } else { "Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits too: "d[.ddd]e<exp>".
    let sci = format!("{:e}", value.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() { String::new() } else { format!(".{tail}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{head}{frac}e{esign}{:02}", exp.unsigned_abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let pad = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{pad}.0")
    } else {
        let (int, frac) = digits.split_at(int_len);
        format!("{sign}{int}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1e20, "1e+20"),
            (1e-7, "1e-07"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (2.5e-5, "2.5e-05"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (123.456, "123.456"),
            (1.5e300, "1.5e+300"),
            (-3.25, "-3.25"),
            (5e-324, "5e-324"),
        ];
        for (v, want) in cases {
            assert_eq!(python_float_repr(v), want, "{v}");
        }
    }

    #[test]
    fn ensure_ascii_escapes_as_utf16() {
        let v = serde_json::json!({"k": "é😀"});
        let opts = DumpOptions { ensure_ascii: true, ..DumpOptions::default() };
        assert_eq!(dumps(&v, &opts).unwrap(), r#"{"k": "\u00e9\ud83d\ude00"}"#);
    }
}
