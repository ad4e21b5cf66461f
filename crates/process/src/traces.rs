//! Traces: one trace per event, across both services.
//!
//! `tracing` spans become OpenTelemetry spans (tracing-opentelemetry). They are
//! exported over OTLP http/protobuf when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, with the SDK's own handling of
//! the standard variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_HEADERS`...).
//! Without an endpoint nothing is exported: the provider has no processor, so
//! spans are created non-recording (their ids still flow into logs and into
//! `traceparent` headers) and cost little. The resource says which service
//! and which build: `service.name` and `service.version`.
//!
//! The W3C trace context crosses the database: the ingest stores its server
//! span's `traceparent` on every outbox row, and each relay attempt continues
//! it, so retries hours later land in the same trace. The ingest continues a
//! received `traceparent` only once the delivery's signature is verified: an
//! unauthenticated header picks neither our trace nor our sampling.

use std::collections::HashMap;

use opentelemetry::KeyValue;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use rand::Rng as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::logs::{self, LogFormat};

/// The `service.version` resource attribute of both services: the
/// workspace's version, which every crate of it (the binaries included)
/// shares. `OTEL_RESOURCE_ATTRIBUTES` may override it.
pub const SERVICE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Owns the tracer provider; [`Telemetry::shutdown`] flushes what is queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
    exporting: bool,
}

impl Telemetry {
    /// Whether spans are exported (an OTLP endpoint is configured).
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// Flushes and stops the exporter. Call once, at exit, outside async code
    /// (the exporter's HTTP client is blocking).
    pub fn shutdown(self) {
        if self.exporting
            && let Err(e) = self.provider.force_flush()
        {
            eprintln!("telemetry: flushing spans failed: {e}");
        }
        let _ = self.provider.shutdown();
    }
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

/// Installs logs and traces for `service` (its default `service.name`;
/// `service.version` is [`SERVICE_VERSION`]).
/// Errors are configuration errors, naming the variable.
pub fn init(service: &'static str, format: LogFormat) -> Result<Telemetry, String> {
    let exporting = env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    for variable in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(protocol) = std::env::var(variable)
            && !protocol.is_empty()
            && protocol != "http/protobuf"
        {
            return Err(format!(
                "{variable}={protocol} is not supported by this build: use http/protobuf (port 4318)"
            ));
        }
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut resource = resource::Resource::builder_empty()
        // Before the detectors: `OTEL_RESOURCE_ATTRIBUTES` may override it.
        .with_attribute(KeyValue::new("service.version", SERVICE_VERSION))
        .with_detectors(&[
            Box::new(resource::SdkProvidedResourceDetector),
            Box::new(resource::TelemetryResourceDetector),
            Box::new(resource::EnvResourceDetector::new()),
        ]);
    if !env_set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name(service);
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if exporting {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()
            .map_err(|e| format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}"))?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let tracer = provider.tracer(service);
    // Spans are traced whatever RUST_LOG says about log lines. Nothing here
    // reads OpenTelemetry's current context (a span's context is taken from
    // the span itself), so entering a span, which an instrumented future does
    // at every poll, attaches nothing and times nothing (no `busy_ns`).
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_target(false)
        .with_filter(tracing_subscriber::filter::Targets::new().with_targets([
            ("webhook_ingest", tracing::Level::INFO),
            ("outbox_relay", tracing::Level::INFO),
        ]));
    let registry = tracing_subscriber::registry().with(otel);
    let installed = match format {
        LogFormat::Json => registry
            .with(logs::JsonLines.with_filter(logs::env_filter()))
            .try_init(),
        LogFormat::Pretty => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(logs::colour(&std::io::stdout()))
                    .with_filter(logs::env_filter()),
            )
            .try_init(),
    };
    if installed.is_err() {
        tracing::debug!("a global subscriber was already installed");
    }
    Ok(Telemetry { provider, exporting })
}

/// The context a `traceparent` value carries (an empty context if none or invalid).
pub fn context_from_traceparent(traceparent: Option<&str>) -> opentelemetry::Context {
    let Some(value) = traceparent else {
        return opentelemetry::Context::new();
    };
    let carrier: HashMap<String, String> = HashMap::from([("traceparent".to_owned(), value.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The `traceparent` naming `span`, if tracing gave it a valid context.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(1);
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The `traceparent` for work done in `span` on behalf of a parent context
/// `parent` (a stored or received `traceparent`): the span's own when tracing
/// is installed, else a child derived by hand, so headers and stored contexts
/// are right even in a process without the tracing layer.
pub fn traceparent_for(span: &tracing::Span, parent: Option<&str>) -> String {
    traceparent_of(span).unwrap_or_else(|| child_traceparent(parent))
}

/// A new span id in the trace of `parent`, or a new trace if it has none.
pub fn child_traceparent(parent: Option<&str>) -> String {
    let mut rng = rand::rng();
    let span_id: u64 = rng.random_range(1..=u64::MAX);
    match parent.and_then(parse_traceparent) {
        Some((trace_id, flags)) => format!("00-{trace_id}-{span_id:016x}-{flags}"),
        None => {
            let trace_id: u128 = rng.random_range(1..=u128::MAX);
            format!("00-{trace_id:032x}-{span_id:016x}-01")
        }
    }
}

/// The trace id and flags of a valid version-00 `traceparent`.
pub fn parse_traceparent(traceparent: &str) -> Option<(&str, &str)> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if version != "00" || parts.next().is_some() || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2)
    {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
        return None;
    }
    Some((trace_id, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_keep_the_trace() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let child = child_traceparent(Some(parent));
        assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(child.ends_with("-01"));
        assert_ne!(child, parent);
        assert!(parse_traceparent(&child).is_some());
    }

    #[test]
    fn missing_or_bad_contexts_start_a_trace() {
        for stored in [
            None,
            Some("garbage"),
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Some("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
            Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"),
        ] {
            if let Some(s) = stored {
                assert!(parse_traceparent(s).is_none(), "{s} is not a valid traceparent");
            }
            let t = child_traceparent(stored);
            assert!(parse_traceparent(&t).is_some(), "{t}");
        }
    }

    #[test]
    fn extraction_round_trips() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = context_from_traceparent(Some(tp));
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(
            !context_from_traceparent(Some("nonsense"))
                .span()
                .span_context()
                .is_valid()
        );
        assert!(!context_from_traceparent(None).span().span_context().is_valid());
    }
}
