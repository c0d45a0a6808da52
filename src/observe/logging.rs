//! Log output: text (tracing's default format) or one JSON object per line (`server.log_format`).
//! The JSON writer is ours, a few lines over serde_json, instead of tracing-subscriber's `json`
//! feature and its extra dependencies.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber (stderr; `RUST_LOG` filters, `info` by default). Text is coloured
/// only on a terminal: a file, a pipe or journald would get the escape codes as text.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.event_format(Json).try_init() } else { builder.try_init() };
}

/// `{"ts":…,"level":…,"target":…,"message":…, <fields>}`.
struct Json;

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut ts = String::new();
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        let meta = event.metadata();
        let mut fields = Fields(serde_json::Map::new());
        fields.0.insert("ts".into(), ts.into());
        fields.0.insert("level".into(), meta.level().as_str().into());
        fields.0.insert("target".into(), meta.target().into());
        event.record(&mut fields);
        writeln!(w, "{}", serde_json::Value::Object(fields.0))
    }
}

struct Fields(serde_json::Map<String, serde_json::Value>);

impl Visit for Fields {
    fn record_f64(&mut self, f: &Field, v: f64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_debug(&mut self, f: &Field, v: &dyn fmt::Debug) {
        self.0.insert(f.name().into(), format!("{v:?}").into());
    }
}
