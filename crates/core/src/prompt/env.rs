//! The minijinja environment set up the way Hugging Face transformers compiles chat templates
//! (`_compile_jinja_template`): trim_blocks + lstrip_blocks, no trailing newline, loop controls,
//! a `json.dumps`-compatible `tojson`, `raise_exception`, `strftime_now`, Python string/dict
//! methods (pycompat) and Python's float formatting. Any difference here changes token counts.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State};
use std::time::{SystemTime, UNIX_EPOCH};

use super::pyjson::{self, DumpOptions};

/// Builds the environment with every template added under its name.
pub(crate) fn build(templates: &[(String, String)]) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    // Templates are not HTML: never escape, whatever the template name looks like.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    for (name, source) in templates {
        env.add_template_owned(name.clone(), source.clone())?;
    }
    Ok(env)
}

/// The template with transformers' `{% generation %}…{% endgeneration %}` tags (which only mark the
/// assistant's part for training masks and render their body) replaced by an always-true `if` block,
/// so minijinja, which has no such tag, renders the body with the same whitespace control.
pub(crate) fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    // Walk the template's delimited regions; only statement tags are rewritten.
    while let Some(start) = ["{{", "{%", "{#"].iter().filter_map(|d| rest.find(d)).min() {
        let close = match &rest[start..start + 2] {
            "{{" => "}}",
            "{#" => "#}",
            _ => "%}",
        };
        let Some(len) = rest[start + 2..].find(close) else { break };
        let end = start + 2 + len + 2;
        let region = &rest[start..end];
        out.push_str(&rest[..start]);
        let inner = region[2..region.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        match (close, inner) {
            ("%}", "generation") => out.push_str(&region.replacen("generation", "if true", 1)),
            ("%}", "endgeneration") => out.push_str(&region.replacen("endgeneration", "endif", 1)),
            _ => out.push_str(region),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `{{ x }}` output: floats as Python's `str(float)`; everything else as minijinja prints it
/// (which already writes `True`/`False`/`None`).
fn python_formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    if value.kind() == ValueKind::Number && !value.is_integer() {
        if let Ok(f) = f64::try_from(value.clone()) {
            let text = if f.is_infinite() {
                // Python's str(float('inf')) differs from json.dumps.
                if f < 0.0 { "-inf" } else { "inf" }.to_owned()
            } else if f.is_nan() {
                "nan".to_owned()
            } else {
                pyjson::python_float_repr(f)
            };
            return out.write_str(&text).map_err(Error::from);
        }
    }
    minijinja::escape_formatter(out, state, value)
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v)?;
                // Python: a non-positive indent still inserts newlines, with no indentation.
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        },
    };
    let mut opts = DumpOptions::default().with_indent(indent);
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<String> = seps
                .try_iter()?
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "tojson: separators must be strings"))?;
            let [item, key]: [String; 2] = parts
                .try_into()
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair"))?;
            opts.item_sep = item;
            opts.key_sep = key;
        }
    }
    opts.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let json =
        serde_json::to_value(value).map_err(|e| Error::new(ErrorKind::BadSerialization, "tojson").with_source(e))?;
    let text =
        pyjson::dumps(&json, &opts).map_err(|e| Error::new(ErrorKind::BadSerialization, "tojson").with_source(e))?;
    // Safe: the output must never be escaped again.
    Ok(Value::from_safe_string(text))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(fmt)`: the current UTC time formatted like Python's `strftime` (the common
/// directives; others are copied through). HF uses local time; routers and workers normally run
/// in UTC containers.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    strftime(&format, secs)
}

pub(crate) fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix_secs / 86_400;
    let rem = unix_secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = ((days + 3) % 7) as usize; // 1970-01-01 was a Thursday (Monday = 0)
    let yday = day_of_year(year, month, day);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's "%-d" style: no zero padding.
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |v: u64, width: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100) as u64, 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: u64) -> (i64, u64, u64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn day_of_year(year: i64, month: u64, day: u64) -> u64 {
    const CUM: [u64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUM[(month - 1) as usize] + day + u64::from(leap && month > 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_instants() {
        // 2024-02-29T13:05:09Z, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(strftime("%A %a %B %j %I%p %-d %y %%", t), "Thursday Thu February 060 01PM 29 24 %");
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
        assert_eq!(strftime("%Q", 0), "%Q");
    }

    #[test]
    fn generation_tags_render_their_body_with_the_same_whitespace() {
        let t = "{% for m in messages %}{%- generation -%}\n  [{{ m }}]  {%- endgeneration %}\n{% endfor %}";
        let plain = without_generation_tags(t);
        assert_eq!(plain, "{% for m in messages %}{%- if true -%}\n  [{{ m }}]  {%- endif %}\n{% endfor %}");
        let env = build(&[("t".into(), plain)]).unwrap();
        let out = env.get_template("t").unwrap().render(minijinja::context! { messages => vec!["a", "b"] }).unwrap();
        assert_eq!(out, "[a][b]");
        // Only statement tags: an expression or a comment mentioning the tag is left alone.
        let other = "{{ '{% generation %}' }} {# {% generation %} #} {% if a %}";
        assert_eq!(without_generation_tags(other), other);
    }

    #[test]
    fn raise_exception_fails_render() {
        let env = build(&[("t".into(), "{{ raise_exception('boom') }}".into())]).unwrap();
        let err = env.get_template("t").unwrap().render(()).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }
}

/// The environment against Python jinja2 as transformers configures it (goldens generated by
/// tests/fixtures/gen_prompt_goldens.py).
#[cfg(test)]
mod parity {
    use super::*;
    use minijinja::value::Serde;

    #[test]
    fn small_templates_match_python_jinja2() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/prompt_goldens.json");
        let goldens: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let cases = goldens["env_cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        let templates: Vec<(String, String)> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| (i.to_string(), c["template"].as_str().unwrap().to_owned()))
            .collect();
        let env = build(&templates).unwrap();
        let mut failures = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let got = env
                .get_template(&i.to_string())
                .unwrap()
                .render(Value::from(Serde(&case["context"])))
                .unwrap_or_else(|e| format!("ERROR {e:#}"));
            let want = case["output"].as_str().unwrap();
            if got != want {
                failures.push(format!("{:?}\n  want {want:?}\n  got  {got:?}", case["template"]));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
