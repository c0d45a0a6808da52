//! `[cluster]`'s NATS connection: the URL, who this replica is to the NATS server (user and password,
//! token, NKey, or a `.creds` file with a JWT) and TLS (a CA file, a client certificate for mTLS).
//!
//! Secrets come inline, from an environment variable (`*_env`) or from a file (`*_file`), one source
//! each; they are held as [`Secret`], whose `Debug` never shows them. Credentials written in the URL
//! (`nats://user:pw@host`, `nats://token@host`) are honoured: taken out of the URL (which is logged)
//! and used as the keys would be; a URL with credentials and a key that sets them too is refused.

use std::path::PathBuf;

/// A secret read from the config, an environment variable or a file: compared, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How this replica authenticates to the NATS server.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A user NKey seed (`SU…`): the server challenges, the seed signs.
    NKey(Secret),
    /// A `.creds` file (a user JWT and its NKey seed), as `nsc` writes it for decentralised auth.
    Creds(PathBuf),
}

impl NatsAuth {
    /// The method's name, for logs (never the secret).
    pub fn method(&self) -> &'static str {
        match self {
            NatsAuth::None => "none",
            NatsAuth::UserPassword { .. } => "user_password",
            NatsAuth::Token(_) => "token",
            NatsAuth::NKey(_) => "nkey",
            NatsAuth::Creds(_) => "creds",
        }
    }
}

/// TLS towards the NATS server.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NatsTls {
    /// Refuse a server that does not offer TLS (set by `tls://`, `nats_tls_required` or any file below).
    pub required: bool,
    /// PEM roots to verify the server with (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that verify clients (mTLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The NATS connection, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSettings {
    /// The server URL without credentials (safe to log).
    pub url: String,
    pub auth: NatsAuth,
    pub tls: NatsTls,
}

/// The `nats_*` keys of `[cluster]`, as written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NatsKeys {
    pub url: String,
    pub user: Option<String>,
    pub password: SecretKeys,
    pub token: SecretKeys,
    pub nkey_seed: SecretKeys,
    pub creds_file: Option<String>,
    pub tls_required: Option<bool>,
    pub tls_ca_file: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
}

/// One secret's three sources, as written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SecretKeys {
    pub inline: Option<String>,
    pub env: Option<String>,
    pub file: Option<String>,
}

impl SecretKeys {
    /// The secret from its one configured source; `key` names it in errors (`cluster.nats_token`).
    fn read(&self, key: &str) -> anyhow::Result<Option<Secret>> {
        let set = [self.inline.is_some(), self.env.is_some(), self.file.is_some()];
        anyhow::ensure!(set.iter().filter(|s| **s).count() <= 1, "{key}, {key}_env and {key}_file: set one");
        let value = if let Some(v) = &self.inline {
            v.clone()
        } else if let Some(var) = &self.env {
            std::env::var(var).map_err(|_| anyhow::anyhow!("{key}_env: environment variable {var} is not set"))?
        } else if let Some(path) = &self.file {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{key}_file: cannot read '{path}': {e}"))?;
            text.trim().to_owned()
        } else {
            return Ok(None);
        };
        // An empty secret would silently connect without authentication.
        anyhow::ensure!(!value.trim().is_empty(), "{key}: the configured source is empty");
        anyhow::ensure!(value.chars().all(|c| !c.is_control()), "{key}: control characters are not allowed");
        Ok(Some(Secret(value)))
    }
}

impl NatsKeys {
    /// No `nats_*` key is set (the URL aside).
    pub fn is_unset(&self) -> bool {
        *self == NatsKeys { url: self.url.clone(), ..NatsKeys::default() }
    }

    /// Validates the connection keys; errors name the key and never show a secret.
    pub fn settings(&self) -> anyhow::Result<NatsSettings> {
        let mut url = url::Url::parse(&self.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "nats" | "tls") && u.host_str().is_some_and(|h| !h.is_empty()))
            .ok_or_else(|| anyhow::anyhow!("cluster.nats_url must be nats://host:port or tls://host:port"))?;
        let from_url = url_credentials(&url)?;
        // Strip them: the URL is logged, and the client must not see them twice.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let from_keys = self.auth()?;
        let auth = match (from_url, from_keys) {
            (NatsAuth::None, keys) => keys,
            (url_auth, NatsAuth::None) => url_auth,
            _ => anyhow::bail!("cluster.nats_url carries credentials and cluster.nats_* keys set them too: set one"),
        };
        let tls = self.tls(url.scheme() == "tls")?;
        Ok(NatsSettings { url: url.to_string().trim_end_matches('/').to_owned(), auth, tls })
    }

    fn auth(&self) -> anyhow::Result<NatsAuth> {
        let password = self.password.read("cluster.nats_password")?;
        let token = self.token.read("cluster.nats_token")?;
        let nkey = self.nkey_seed.read("cluster.nats_nkey_seed")?;
        let mut methods = Vec::new();
        match (&self.user, password) {
            (Some(user), Some(password)) => {
                anyhow::ensure!(
                    !user.is_empty() && user.chars().all(|c| !c.is_control()),
                    "cluster.nats_user must be a non-empty name"
                );
                methods.push(NatsAuth::UserPassword { user: user.clone(), password });
            }
            (None, None) => {}
            _ => anyhow::bail!("cluster.nats_user and cluster.nats_password(_env/_file) go together"),
        }
        if let Some(t) = token {
            methods.push(NatsAuth::Token(t));
        }
        if let Some(seed) = nkey {
            anyhow::ensure!(
                seed.expose().starts_with("SU") && seed.expose().len() == 58,
                "cluster.nats_nkey_seed must be a user NKey seed (58 characters starting with SU)"
            );
            methods.push(NatsAuth::NKey(seed));
        }
        if let Some(path) = &self.creds_file {
            methods.push(NatsAuth::Creds(readable("cluster.nats_creds_file", path)?));
        }
        anyhow::ensure!(
            methods.len() <= 1,
            "cluster: set one NATS authentication (user/password, token, nkey seed or creds file), not several"
        );
        Ok(methods.pop().unwrap_or_default())
    }

    fn tls(&self, tls_scheme: bool) -> anyhow::Result<NatsTls> {
        let ca_file = self.tls_ca_file.as_deref().map(|p| readable("cluster.nats_tls_ca_file", p)).transpose()?;
        let client_cert = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(c), Some(k)) => {
                Some((readable("cluster.nats_tls_cert_file", c)?, readable("cluster.nats_tls_key_file", k)?))
            }
            (None, None) => None,
            _ => anyhow::bail!("cluster.nats_tls_cert_file and cluster.nats_tls_key_file go together"),
        };
        let implied = tls_scheme || ca_file.is_some() || client_cert.is_some();
        if self.tls_required == Some(false) && implied {
            anyhow::bail!("cluster.nats_tls_required = false contradicts tls:// or the nats_tls_* files");
        }
        Ok(NatsTls { required: implied || self.tls_required == Some(true), ca_file, client_cert })
    }
}

/// `nats://user:pw@host` or `nats://token@host`.
fn url_credentials(url: &url::Url) -> anyhow::Result<NatsAuth> {
    let decode =
        |s: &str| percent_decode(s).ok_or_else(|| anyhow::anyhow!("cluster.nats_url: credentials are not valid UTF-8"));
    let user = decode(url.username())?;
    Ok(match (user.is_empty(), url.password()) {
        (true, None) => NatsAuth::None,
        (true, Some(_)) => anyhow::bail!("cluster.nats_url has a password without a user"),
        (false, None) => NatsAuth::Token(Secret(user)),
        (false, Some(pw)) => NatsAuth::UserPassword { user, password: Secret(decode(pw)?) },
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A file the replica must read at connect time: checked now, so a typo fails at start.
fn readable(key: &str, path: &str) -> anyhow::Result<PathBuf> {
    std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{key}: cannot read '{path}': {e}"))?;
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(url: &str) -> NatsKeys {
        NatsKeys { url: url.into(), ..NatsKeys::default() }
    }

    #[test]
    fn url_credentials_are_honoured_and_stripped() {
        let s = keys("nats://router:p%40ss@127.0.0.1:4222").settings().unwrap();
        assert_eq!(s.url, "nats://127.0.0.1:4222");
        assert_eq!(s.auth, NatsAuth::UserPassword { user: "router".into(), password: Secret::new("p@ss") });
        let s = keys("nats://s3cr3t@127.0.0.1:4222").settings().unwrap();
        assert_eq!((s.url.as_str(), s.auth), ("nats://127.0.0.1:4222", NatsAuth::Token(Secret::new("s3cr3t"))));
        assert!(!s.tls.required);
        let s = keys("tls://nats.example:4222").settings().unwrap();
        assert!(s.tls.required, "tls:// requires TLS");
        let err = keys("nats://:pw@h:1").settings().unwrap_err().to_string();
        assert!(err.contains("password without a user"), "{err}");
    }

    #[test]
    fn secrets_never_show_in_debug_output_or_errors() {
        let mut k = keys("nats://tok-123@127.0.0.1:4222");
        let s = k.settings().unwrap();
        assert!(!format!("{s:?}").contains("tok-123"), "{s:?}");
        k.token.inline = Some("other".into());
        let err = k.settings().unwrap_err().to_string();
        assert!(err.contains("set one") && !err.contains("tok-123") && !err.contains("other"), "{err}");
    }

    #[test]
    fn each_method_from_each_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let mut k = keys("nats://127.0.0.1:4222");
        k.user = Some("u".into());
        k.password.file = Some(file.to_string_lossy().into());
        assert_eq!(
            k.settings().unwrap().auth,
            NatsAuth::UserPassword { user: "u".into(), password: Secret::new("from-file") }
        );
        let mut k = keys("nats://127.0.0.1:4222");
        std::env::set_var("MMROUTER_TEST_NATS_TOKEN", "from-env");
        k.token.env = Some("MMROUTER_TEST_NATS_TOKEN".into());
        assert_eq!(k.settings().unwrap().auth, NatsAuth::Token(Secret::new("from-env")));
        let mut k = keys("nats://127.0.0.1:4222");
        let seed = format!("SU{}", "A".repeat(56));
        k.nkey_seed.inline = Some(seed.clone());
        assert_eq!(k.settings().unwrap().auth, NatsAuth::NKey(Secret::new(seed)));
        let mut k = keys("nats://127.0.0.1:4222");
        k.creds_file = Some(file.to_string_lossy().into());
        assert_eq!(k.settings().unwrap().auth, NatsAuth::Creds(file.clone()));
        k.tls_ca_file = Some(file.to_string_lossy().into());
        let tls = k.settings().unwrap().tls;
        assert!(tls.required && tls.ca_file.is_some(), "a CA file implies TLS");
    }

    #[test]
    fn contradictions_and_half_settings_are_refused_with_the_key() {
        type Case = (fn(&mut NatsKeys), &'static str);
        let cases: [Case; 7] = [
            (|k| k.user = Some("u".into()), "cluster.nats_user"),
            (|k| k.password.inline = Some("p".into()), "cluster.nats_user"),
            (|k| k.nkey_seed.inline = Some("SXnotaseed".into()), "cluster.nats_nkey_seed"),
            (|k| k.tls_cert_file = Some("/etc/hostname".into()), "cluster.nats_tls_key_file"),
            (|k| k.tls_ca_file = Some("/nonexistent/ca.pem".into()), "cluster.nats_tls_ca_file"),
            (
                |k| {
                    k.token.inline = Some("t".into());
                    k.creds_file = Some("/etc/hostname".into());
                },
                "not several",
            ),
            (
                |k| {
                    k.token.inline = Some("t".into());
                    k.token.env = Some("X".into());
                },
                "set one",
            ),
        ];
        for (set, key) in cases {
            let mut k = keys("nats://127.0.0.1:4222");
            set(&mut k);
            let err = k.settings().unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
        let mut k = keys("tls://127.0.0.1:4222");
        k.tls_required = Some(false);
        assert!(k.settings().unwrap_err().to_string().contains("nats_tls_required"));
        let mut k = keys("nats://127.0.0.1:4222");
        k.token.inline = Some("  ".into());
        assert!(k.settings().unwrap_err().to_string().contains("empty"));
        assert!(keys("http://127.0.0.1:4222").settings().is_err());
    }
}
