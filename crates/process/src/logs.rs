//! Logs: one JSON object per line on stdout (`LOG_FORMAT=json`, the default),
//! or human-readable lines (`pretty`), filtered by `RUST_LOG`.
//!
//! A JSON line written inside an event's spans carries the event's identity as
//! top-level keys (`event_id`, and for the relay `outbox_id`, `kind`,
//! `attempt`, `idempotency_key`), so an SRE can grep one event id and see every line about it.
//!
//! What is never logged: secrets, signatures and raw bodies. Nothing here
//! logs request data on its own; callers log identifiers only.
//!
//! The lines are written to stdout in batches, every [`FLUSH_EVERY`] at most
//! (see [`Sink`]), and all of them when the service stops ([`flush`]).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Pretty,
}

/// Span fields lifted onto every log line written inside the span, renamed.
const LIFTED: &[(&str, &str)] = &[
    ("webhook.event_id", "event_id"),
    ("webhook.event_type", "event_type"),
    ("outbox.id", "outbox_id"),
    ("outbox.kind", "kind"),
    ("outbox.attempt", "attempt"),
    ("idempotency_key", "idempotency_key"),
];

/// The filter: `RUST_LOG`, else `info` for our crates and `warn` for the rest.
pub fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("warn,webhook_ingest=info,outbox_relay=info,simulator=info,process=info,db=info")
    })
}

/// Fields of a span worth lifting, kept in the span's extensions.
#[derive(Default)]
struct Lifted(Vec<(&'static str, serde_json::Value)>);

struct LiftVisitor<'a>(&'a mut Lifted);

impl LiftVisitor<'_> {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        if let Some((_, key)) = LIFTED.iter().find(|(name, _)| *name == field.name()) {
            self.0.0.retain(|(k, _)| k != key);
            self.0.0.push((key, value));
        }
    }
}

impl Visit for LiftVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

/// An event's own fields: `message` and the rest, in the order recorded.
struct EventVisitor(Vec<(&'static str, serde_json::Value)>);

impl EventVisitor {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.0.push((field.name(), value));
    }
}

impl Visit for EventVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, error_chain(value).into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

/// One JSON object written straight into a buffer: no map is built (a line
/// per downstream call is on the relay's hot path), and a key already
/// written is skipped, so the first writer of a key wins.
struct Line {
    buf: Vec<u8>,
    keys: Vec<&'static str>,
}

impl Line {
    fn new() -> Self {
        let mut buf = Vec::with_capacity(512);
        buf.push(b'{');
        Self {
            buf,
            keys: Vec::with_capacity(16),
        }
    }

    fn key(&mut self, key: &'static str) -> bool {
        if self.keys.contains(&key) {
            return false;
        }
        if !self.keys.is_empty() {
            self.buf.push(b',');
        }
        self.keys.push(key);
        let _ = serde_json::to_writer(&mut self.buf, key);
        self.buf.push(b':');
        true
    }

    fn put(&mut self, key: &'static str, value: &(impl serde::Serialize + ?Sized)) {
        if self.key(key) {
            let _ = serde_json::to_writer(&mut self.buf, value);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(b"}\n");
        self.buf
    }
}

/// The JSON lines layer.
#[derive(Debug, Default)]
pub struct JsonLines;

impl<S> Layer<S> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut lifted = Lifted::default();
        attrs.record(&mut LiftVisitor(&mut lifted));
        span.extensions_mut().insert(lifted);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(lifted) = ext.get_mut::<Lifted>() {
            values.record(&mut LiftVisitor(lifted));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut line = Line::new();
        let now = time::OffsetDateTime::now_utc();
        if line.key("timestamp") {
            line.buf.push(b'"');
            let _ = now.format_into(&mut line.buf, &time::format_description::well_known::Rfc3339);
            line.buf.push(b'"');
        }
        line.put("level", event.metadata().level().as_str());
        line.put("target", event.metadata().target());
        let mut fields = EventVisitor(Vec::new());
        event.record(&mut fields);
        if let Some((_, message)) = fields.0.iter().find(|(k, _)| *k == "message") {
            line.put("message", message);
        }
        if let Some(scope) = ctx.event_scope(event) {
            // Innermost span first: its fields win over outer ones'.
            let mut innermost = None;
            for span in scope {
                innermost.get_or_insert_with(|| span.id());
                let ext = span.extensions();
                if let Some(lifted) = ext.get::<Lifted>() {
                    for (key, value) in &lifted.0 {
                        line.put(key, value);
                    }
                }
            }
            if let Some((trace_id, span_id)) = innermost.and_then(|id| trace_ids(&id)) {
                line.put("trace_id", &trace_id);
                line.put("span_id", &span_id);
            }
        }
        for (key, value) in &fields.0 {
            line.put(key, value);
        }
        let sink = sink();
        sink.push(&line.finish());
        // A warning or an error is what a crash right after must not take.
        if *event.metadata().level() <= tracing::Level::WARN {
            sink.write_held();
        }
    }
}

/// How long a line may wait in the [`Sink`] before it is written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);

/// Lines held at most before the thread that logs one writes them itself.
const HELD_BYTES: usize = 1 << 20;

/// The JSON lines on their way to stdout. A line is appended to a buffer
/// (whole, so lines never interleave) and a thread writes the buffer every
/// [`FLUSH_EVERY`]: a busy service (a line per webhook, a line per
/// downstream call) makes one `write` per batch of lines rather than one per
/// line (about a microsecond a line on the bench's host, of the 5 to 6 a
/// relay's line cost in all: docs/BENCHMARK.md). A line waits
/// 10 ms at most; a warning or an error is written at once (with what came
/// before it), and [`flush`] writes what is left when the service stops or
/// when a line must be out before an answer (the console's audit lines); a
/// process killed outright loses the `info` lines of its last 10 ms. Past
/// [`HELD_BYTES`] (stdout not keeping up) the thread logging writes them
/// itself, as every line was written before.
struct Sink {
    lines: Mutex<Vec<u8>>,
    /// The batch being written: held while a batch is taken and written, so
    /// batches keep their order; swapped with `lines` and cleared, so neither
    /// buffer is allocated again.
    writing: Mutex<Vec<u8>>,
    /// Whether the writer thread runs (else each line is written at once).
    background: AtomicBool,
}

static SINK: OnceLock<&'static Sink> = OnceLock::new();

fn sink() -> &'static Sink {
    SINK.get_or_init(|| {
        let sink: &'static Sink = Box::leak(Box::new(Sink {
            lines: Mutex::new(Vec::with_capacity(64 * 1024)),
            writing: Mutex::new(Vec::with_capacity(64 * 1024)),
            background: AtomicBool::new(false),
        }));
        let spawned = std::thread::Builder::new().name("log-writer".into()).spawn(|| {
            loop {
                std::thread::sleep(FLUSH_EVERY);
                sink.write_held();
            }
        });
        sink.background.store(spawned.is_ok(), Ordering::Release);
        sink
    })
}

impl Sink {
    fn push(&self, line: &[u8]) {
        let full = {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            lines.extend_from_slice(line);
            lines.len() >= HELD_BYTES
        };
        if full || !self.background.load(Ordering::Acquire) {
            self.write_held();
        }
    }

    fn write_held(&self) {
        let mut batch = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            if lines.is_empty() {
                return;
            }
            std::mem::swap(&mut *lines, &mut *batch);
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&batch);
        let _ = out.flush();
        batch.clear();
    }
}

/// Writes the lines not yet written: at exit, or before a line must be seen.
pub fn flush() {
    if let Some(sink) = SINK.get() {
        sink.write_held();
    }
}

/// Calls [`flush`] when dropped: when a service returns, and when it unwinds.
pub struct FlushOnDrop;

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        flush();
    }
}

/// The OpenTelemetry trace and span id of a span, when the tracing layer is
/// installed and the span has a valid context.
fn trace_ids(id: &Id) -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt as _;
    tracing::dispatcher::get_default(|dispatch| {
        let cx = tracing_opentelemetry::get_otel_context(id, dispatch)?;
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    })
}

/// Installs a global subscriber with logs only (no traces): for tests and
/// tools. The services use [`crate::traces::init`].
pub fn init(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let registry = tracing_subscriber::registry().with(env_filter());
    let result = match format {
        LogFormat::Json => registry.with(JsonLines).try_init(),
        LogFormat::Pretty => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(colour(&std::io::stdout())),
            )
            .try_init(),
    };
    if result.is_err() {
        tracing::debug!("a global subscriber was already installed");
    }
}

/// Colours in the pretty format only when `stream` is a terminal, and never
/// with `NO_COLOR` set (no-color.org): a piped or captured log stays plain
/// text.
pub fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// An error and its causes, on one line: [`db::error_chain`].
pub use db::error_chain;
