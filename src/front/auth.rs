//! Authentication (off unless keys are configured, `[auth]`):
//!
//! * `/v1/*` needs one of the client keys (`auth.api_keys*`) as `Authorization: Bearer <key>`.
//! * `/metrics` and `/debug/*` need an admin key when admin keys are configured; without them,
//!   `/debug/*` (which plans requests and fetches image URLs) needs a client key and `/metrics` is open.
//! * `/health` is always open (load balancers probe it).
//!
//! A missing or wrong key gets OpenAI's 401 (`invalid_api_key`). Keys are compared in constant time,
//! against every configured key, so neither the match nor which key matched shows in the timing.
//! On its way to a worker, the request's `Authorization` is forwarded, stripped or replaced
//! (`auth.upstream_authorization`): the forward path sends the request's headers as they are after
//! this layer.

use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::config::{AuthSettings, UpstreamAuth};
use crate::error::ApiError;
use crate::observe::Observer;

/// The configured keys and the worker-side policy.
pub struct Auth {
    client: Vec<Vec<u8>>,
    admin: Vec<Vec<u8>>,
    /// `None`: forward as received; `Some(None)`: strip; `Some(Some(v))`: replace with `v`.
    upstream: Option<Option<HeaderValue>>,
}

/// Which keys a path needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Client,
    Admin,
}

impl Scope {
    fn label(self) -> &'static str {
        match self {
            Scope::Client => "client",
            Scope::Admin => "admin",
        }
    }
}

impl Auth {
    pub fn new(s: &AuthSettings) -> Auth {
        let bytes = |keys: &[String]| keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        let upstream = match &s.upstream {
            UpstreamAuth::Forward => None,
            UpstreamAuth::Strip => Some(None),
            // Validated as header-safe when the config was read.
            UpstreamAuth::Replace(key) => Some(HeaderValue::from_str(&format!("Bearer {key}")).ok()),
        };
        Auth { client: bytes(&s.api_keys), admin: bytes(&s.admin_keys), upstream }
    }

    /// The scope a path needs and the keys that satisfy it; `None`: open.
    fn required(&self, path: &str) -> Option<(Scope, &[Vec<u8>])> {
        let admin_path = path == "/metrics" || path.starts_with("/debug/") || path.starts_with("/admin/");
        if path.starts_with("/v1/") {
            (!self.client.is_empty()).then_some((Scope::Client, self.client.as_slice()))
        } else if admin_path && !self.admin.is_empty() {
            Some((Scope::Admin, self.admin.as_slice()))
        } else if path.starts_with("/debug/") && !self.client.is_empty() {
            Some((Scope::Client, self.client.as_slice()))
        } else {
            None
        }
    }

    /// What a worker receives as `Authorization`, applied to the request's headers.
    pub fn rewrite_upstream(&self, headers: &mut HeaderMap) {
        match &self.upstream {
            None => {}
            Some(None) => {
                headers.remove(AUTHORIZATION);
            }
            Some(Some(v)) => {
                headers.insert(AUTHORIZATION, v.clone());
            }
        }
    }
}

/// Marks a request whose admin key was checked (the admin API then also serves non-loopback peers).
#[derive(Clone, Copy, Debug)]
pub struct AdminAuthorized;

impl Auth {
    /// Checks the request's key where one is required, and rewrites the worker-bound `Authorization`
    /// of `/v1/*` calls. Returns the 401 of a refused request (counted by scope).
    pub fn refusal(&self, req: &mut Request, observe: &Observer) -> Option<Response> {
        let v1 = req.uri().path().starts_with("/v1/");
        if let Some((scope, keys)) = self.required(req.uri().path()) {
            if scope == Scope::Admin {
                req.extensions_mut().insert(AdminAuthorized);
            }
            if let Err(e) = check(keys, req.headers()) {
                observe.auth_failed(scope.label());
                observe.rejected(401, "invalid_api_key");
                let mut resp = e.into_response();
                resp.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return Some(resp);
            }
        }
        if v1 {
            self.rewrite_upstream(req.headers_mut());
        }
        None
    }
}

fn check(keys: &[Vec<u8>], headers: &HeaderMap) -> Result<(), ApiError> {
    let unauthorized =
        |msg: &str| ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", msg);
    let Some(presented) = bearer(headers) else {
        return Err(unauthorized(
            "You didn't provide an API key. Provide it as an Authorization header: 'Authorization: Bearer YOUR_KEY'.",
        ));
    };
    if matches_any(keys, presented) {
        Ok(())
    } else {
        Err(unauthorized("Incorrect API key provided."))
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| token.trim_ascii()).filter(|t| !t.is_empty())
}

/// Whether `presented` equals any key; every key is compared, whatever matched earlier.
pub fn matches_any(keys: &[Vec<u8>], presented: &[u8]) -> bool {
    keys.iter().fold(false, |found, k| found | constant_time_eq(k, presented))
}

/// Byte equality in time that depends only on the lengths, never on where the bytes differ.
/// (A length mismatch is folded into the same accumulator; the loop runs over the longer input.)
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    // Keeps the optimiser from turning the loop into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"sk-abc", b"sk-abc"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-abd"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-ab"));
        assert!(!constant_time_eq(b"sk-ab", b"sk-ab\0"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn any_of_several_keys_matches() {
        let keys = vec![b"old-key".to_vec(), b"new-key".to_vec()];
        assert!(matches_any(&keys, b"old-key"));
        assert!(matches_any(&keys, b"new-key"));
        assert!(!matches_any(&keys, b"other"));
        assert!(!matches_any(&[], b"other"));
    }

    #[test]
    fn bearer_token_is_parsed() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("bearer  k1 "));
        assert_eq!(bearer(&h), Some(&b"k1"[..]));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic a2V5"));
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn scopes_follow_the_configured_keys() {
        let s = |api: &[&str], admin: &[&str]| AuthSettings {
            api_keys: api.iter().map(|k| k.to_string()).collect(),
            admin_keys: admin.iter().map(|k| k.to_string()).collect(),
            upstream: UpstreamAuth::Forward,
        };
        let off = Auth::new(&s(&[], &[]));
        assert!(["/v1/models", "/metrics", "/debug/route", "/health"].iter().all(|p| off.required(p).is_none()));
        let client = Auth::new(&s(&["c"], &[]));
        assert_eq!(client.required("/v1/chat/completions").map(|r| r.0), Some(Scope::Client));
        assert_eq!(client.required("/debug/route").map(|r| r.0), Some(Scope::Client));
        assert!(client.required("/metrics").is_none() && client.required("/health").is_none());
        let both = Auth::new(&s(&["c"], &["a"]));
        assert_eq!(both.required("/metrics").map(|r| r.0), Some(Scope::Admin));
        assert_eq!(both.required("/debug/route").map(|r| r.0), Some(Scope::Admin));
        assert!(both.required("/health").is_none());
    }
}
