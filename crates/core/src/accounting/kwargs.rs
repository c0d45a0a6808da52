//! Where every counting parameter comes from.
//!
//! Processor parameters are layered like the engines do it: per-request `mm_processor_kwargs` over the
//! server's `--mm-processor-kwargs` over `preprocessor_config.json`. Model parameters come from
//! `config.json`. The typed getters never invent a default: a missing field is
//! [`AccountingError::ConfigMissingField`] naming the field and file, and a bad value names where it
//! came from (a file field or a kwarg).

use serde_json::{Map, Value};

use super::error::AccountingError;

pub(super) const PREPROCESSOR_FILE: &str = "preprocessor_config.json";
pub(super) const CONFIG_FILE: &str = "config.json";
pub(super) const SERVER_KWARGS: &str = "server processor_kwargs";
pub(super) const REQUEST_KWARGS: &str = "request mm_processor_kwargs";

/// Proxy-only server key (mirrors vLLM `--tokenizer-mode`): selects Pixtral/Mistral3 rounding.
pub(super) const TOKENIZER_MODE: &str = "tokenizer_mode";

type Kwargs = Map<String, Value>;

/// A value found for a key, with the layer it came from (for error messages).
#[derive(Clone, Copy)]
pub(super) struct Found<'a> {
    pub(super) value: &'a Value,
    pub(super) origin: &'static str,
}

/// The three processor layers plus `config.json`.
#[derive(Clone, Copy)]
pub(super) struct Layers<'a> {
    pp: &'a Value,
    cfg: &'a Value,
    server: &'a Kwargs,
    request: Option<&'a Kwargs>,
}

impl<'a> Layers<'a> {
    pub(super) fn new(pp: &'a Value, cfg: &'a Value, server: &'a Kwargs, request: Option<&'a Kwargs>) -> Self {
        Layers { pp, cfg, server, request }
    }

    /// Processor layers from lowest to highest precedence, nulls meaning "not set".
    pub(super) fn processor_layers(&self) -> impl Iterator<Item = (&'static str, &'a Kwargs)> {
        let file = self.pp.as_object().map(|m| (PREPROCESSOR_FILE, m));
        let server = Some((SERVER_KWARGS, self.server));
        let request = self.request.map(|m| (REQUEST_KWARGS, m));
        [file, server, request].into_iter().flatten()
    }

    /// Highest-precedence non-null value of a processor key.
    pub(super) fn proc(&self, key: &str) -> Option<Found<'a>> {
        let mut found = None;
        for (origin, map) in self.processor_layers() {
            if let Some(value) = map.get(key).filter(|v| !v.is_null()) {
                found = Some(Found { value, origin });
            }
        }
        found
    }

    /// Highest-precedence non-null kwarg (server or request) of a key that lives in `config.json`
    /// otherwise (remote-code processors read their parameters from the model config).
    pub(super) fn kwarg_or_cfg(&self, key: &str) -> Option<Found<'a>> {
        let request = self.request.and_then(|m| m.get(key)).filter(|v| !v.is_null());
        let server = self.server.get(key).filter(|v| !v.is_null());
        match (request, server) {
            (Some(value), _) => Some(Found { value, origin: REQUEST_KWARGS }),
            (None, Some(value)) => Some(Found { value, origin: SERVER_KWARGS }),
            (None, None) => self.cfg_found(&[key]),
        }
    }

    pub(super) fn proc_pos(&self, key: &str) -> Result<u64, AccountingError> {
        let found = self.proc(key).ok_or_else(|| missing(PREPROCESSOR_FILE, key))?;
        found.pos(key)
    }

    pub(super) fn proc_bool(&self, key: &str) -> Result<bool, AccountingError> {
        let found = self.proc(key).ok_or_else(|| missing(PREPROCESSOR_FILE, key))?;
        found.bool(key)
    }

    pub(super) fn proc_opt_bool(&self, key: &str) -> Result<Option<bool>, AccountingError> {
        self.proc(key).map(|f| f.bool(key)).transpose()
    }

    pub(super) fn proc_opt_f64(&self, key: &str) -> Result<Option<f64>, AccountingError> {
        self.proc(key).map(|f| f.f64(key)).transpose()
    }

    /// `key.sub` where a higher layer's `key` object replaces a lower one whole (HF kwarg semantics).
    pub(super) fn proc_nested_u64(&self, key: &str, sub: &str) -> Result<u64, AccountingError> {
        let name = format!("{key}.{sub}");
        let found = self.proc(key).ok_or_else(|| missing(PREPROCESSOR_FILE, &name))?;
        let obj = found.value.as_object().ok_or_else(|| found.invalid(key, "must be an object"))?;
        let value = obj.get(sub).filter(|v| !v.is_null()).ok_or_else(|| match found.origin {
            PREPROCESSOR_FILE => missing(PREPROCESSOR_FILE, &name),
            origin => kwarg_error(origin, key, format!("lacks `{sub}`")),
        })?;
        Found { value, origin: found.origin }.u64(&name)
    }

    /// A dotted path in `config.json`.
    pub(super) fn cfg(&self, path: &[&str]) -> Option<&'a Value> {
        let mut v = self.cfg;
        for p in path {
            v = v.get(p)?;
        }
        (!v.is_null()).then_some(v)
    }

    pub(super) fn cfg_found(&self, path: &[&str]) -> Option<Found<'a>> {
        self.cfg(path).map(|value| Found { value, origin: CONFIG_FILE })
    }

    pub(super) fn cfg_pos(&self, path: &[&str]) -> Result<u64, AccountingError> {
        let name = path.join(".");
        let found = self.cfg_found(path).ok_or_else(|| missing(CONFIG_FILE, &name))?;
        found.pos(&name)
    }

    pub(super) fn cfg_f64(&self, path: &[&str]) -> Result<f64, AccountingError> {
        let name = path.join(".");
        let found = self.cfg_found(path).ok_or_else(|| missing(CONFIG_FILE, &name))?;
        found.f64(&name)
    }

    pub(super) fn cfg_str(&self, path: &[&str]) -> Option<&'a str> {
        self.cfg(path).and_then(Value::as_str)
    }

    pub(super) fn pp_str(&self, key: &str) -> Option<&'a str> {
        self.pp.get(key).and_then(Value::as_str)
    }

    /// The server-level value of a proxy-only key.
    pub(super) fn server_value(&self, key: &str) -> Option<&'a Value> {
        self.server.get(key)
    }
}

impl Found<'_> {
    pub(super) fn invalid(&self, field: &str, detail: impl Into<String>) -> AccountingError {
        invalid_at(self.origin, field, detail)
    }

    /// A positive integer: zero would divide by zero downstream.
    pub(super) fn pos(&self, field: &str) -> Result<u64, AccountingError> {
        match self.u64(field)? {
            0 => Err(self.invalid(field, "must be positive")),
            n => Ok(n),
        }
    }

    /// A non-negative integer (an integral float such as `448.0` is accepted, as Python would).
    pub(super) fn u64(&self, field: &str) -> Result<u64, AccountingError> {
        if let Some(n) = self.value.as_u64() {
            return Ok(n);
        }
        match self.value.as_f64() {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= super::num::EXACT_F64 as f64 => Ok(x as u64),
            _ => Err(self.invalid(field, format!("must be a non-negative integer, got {}", self.value))),
        }
    }

    pub(super) fn bool(&self, field: &str) -> Result<bool, AccountingError> {
        self.value.as_bool().ok_or_else(|| self.invalid(field, format!("must be a boolean, got {}", self.value)))
    }

    pub(super) fn f64(&self, field: &str) -> Result<f64, AccountingError> {
        match self.value.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => Err(self.invalid(field, format!("must be a number, got {}", self.value))),
        }
    }

    /// A side given as a number or as a square `[h, w]` pair (HF configs use both forms).
    pub(super) fn square_u64(&self, field: &str) -> Result<u64, AccountingError> {
        let Some(list) = self.value.as_array() else {
            return self.u64(field);
        };
        let [a, b] = list.as_slice() else {
            return Err(self.invalid(field, "must be a number or a [height, width] pair"));
        };
        let a = Found { value: a, origin: self.origin }.u64(field)?;
        let b = Found { value: b, origin: self.origin }.u64(field)?;
        if a != b {
            return Err(self.invalid(field, format!("non-square {a}x{b} is not modelled")));
        }
        Ok(a)
    }
}

pub(super) fn missing(file: &'static str, field: &str) -> AccountingError {
    AccountingError::ConfigMissingField { file, field: field.to_string() }
}

pub(super) fn kwarg_error(origin: &'static str, key: &str, detail: impl Into<String>) -> AccountingError {
    AccountingError::ProcessorKwargs { source_name: origin, key: key.to_string(), detail: detail.into() }
}

/// Refuses every key the family does not model: an unknown override would make the count a guess.
pub(super) fn check_keys(kwargs: &Kwargs, allowed: &[&str], origin: &'static str) -> Result<(), AccountingError> {
    match kwargs.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(kwarg_error(
            origin,
            key,
            if allowed.is_empty() {
                "this model family models no processor kwargs".to_string()
            } else {
                format!("not modelled for this family (modelled: {})", allowed.join(", "))
            },
        )),
        None => Ok(()),
    }
}

pub(super) fn invalid_at(origin: &'static str, field: &str, detail: impl Into<String>) -> AccountingError {
    match origin {
        PREPROCESSOR_FILE | CONFIG_FILE => {
            AccountingError::ConfigInvalidField { file: origin, field: field.to_string(), detail: detail.into() }
        }
        origin => kwarg_error(origin, field, detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Kwargs {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn precedence_is_request_over_server_over_file() {
        let pp = json!({"a": 1, "b": 1, "c": 1});
        let cfg = json!({});
        let server = map(json!({"b": 2, "c": 2}));
        let request = map(json!({"c": 3}));
        let l = Layers::new(&pp, &cfg, &server, Some(&request));
        assert_eq!(l.proc("a").map(|f| f.u64("a")), Some(Ok(1)));
        assert_eq!(l.proc("b").map(|f| f.u64("b")), Some(Ok(2)));
        assert_eq!(l.proc("c").map(|f| f.u64("c")), Some(Ok(3)));
    }

    #[test]
    fn null_means_unset_and_missing_names_field_and_file() {
        let pp = json!({"a": null});
        let cfg = json!({"vision_config": {}});
        let server = Kwargs::new();
        let l = Layers::new(&pp, &cfg, &server, None);
        let err = l.proc_pos("a").unwrap_err();
        assert_eq!(err.label(), "config_missing_field");
        assert!(err.to_string().contains("preprocessor_config.json") && err.to_string().contains("`a`"));
        let err = l.cfg_pos(&["vision_config", "patch_size"]).unwrap_err();
        assert!(err.to_string().contains("config.json") && err.to_string().contains("vision_config.patch_size"));
    }

    #[test]
    fn bad_values_name_their_origin() {
        let pp = json!({"n": "x"});
        let cfg = json!({});
        let server = map(json!({"m": -1}));
        let l = Layers::new(&pp, &cfg, &server, None);
        assert_eq!(l.proc_pos("n").unwrap_err().label(), "config_invalid_field");
        assert_eq!(l.proc_pos("m").unwrap_err().label(), "processor_kwargs");
        let pp = json!({"n": 448.0, "s": [448, 448], "t": [448, 224]});
        let l = Layers::new(&pp, &cfg, &server, None);
        assert_eq!(l.proc_pos("n"), Ok(448));
        assert_eq!(l.proc("s").map(|f| f.square_u64("s")), Some(Ok(448)));
        assert!(l.proc("t").map(|f| f.square_u64("t")).is_some_and(|r| r.is_err()));
    }

    #[test]
    fn nested_objects_replace_whole() {
        let pp = json!({"size": {"shortest_edge": 1, "longest_edge": 2}});
        let cfg = json!({});
        let server = map(json!({"size": {"longest_edge": 9}}));
        let l = Layers::new(&pp, &cfg, &server, None);
        assert_eq!(l.proc_nested_u64("size", "longest_edge"), Ok(9));
        assert_eq!(l.proc_nested_u64("size", "shortest_edge").unwrap_err().label(), "processor_kwargs");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let kw = map(json!({"min_pixels": 1, "foo": 2}));
        let err = check_keys(&kw, &["min_pixels"], REQUEST_KWARGS).unwrap_err();
        assert_eq!(err.label(), "processor_kwargs");
        assert!(err.to_string().contains("foo"));
        assert!(check_keys(&map(json!({"min_pixels": 1})), &["min_pixels"], SERVER_KWARGS).is_ok());
    }
}
