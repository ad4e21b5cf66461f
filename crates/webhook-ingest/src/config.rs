//! Configuration: every setting is an environment variable and the matching
//! kebab-case flag. Invalid values stop the process at start-up with one
//! line naming the variable (exit 2), see `process::config`. The settings
//! every service shares (database, admin listener, log format) are
//! `process::args` groups, flattened here.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use process::{AdminArgs, DatabaseArgs, LogArgs, Secret};
use signature::Scheme;

/// The shortest signing key the ingest accepts, in bytes (after base64
/// decoding of a `whsec_...` secret): a shorter HMAC key can be guessed.
pub const MIN_SECRET_BYTES: usize = 16;

#[derive(Debug, Parser)]
#[command(
    name = "webhook-ingest",
    version,
    about = "Receives payment webhooks: verify, claim the event id, change the order and enqueue outbox commands in one transaction."
)]
pub struct Cli {
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve webhooks (the default).
    ///
    /// Its settings are the top-level flags and variables (`webhook-ingest
    /// --help`): flags go before `serve`. `run` is the same command, as it
    /// is the relay's.
    #[command(
        after_help = "Examples:\n  WEBHOOK_SECRETS=whsec_... DATABASE_URL=postgres://... webhook-ingest\n  webhook-ingest --ingest-listen-addr 127.0.0.1:8080 serve"
    )]
    #[command(alias = "run")]
    Serve,
    /// Apply the embedded migrations and exit; safe to run concurrently and repeatedly.
    #[command(
        after_help = "Examples:\n  DATABASE_URL=postgres://owner@db/payments webhook-ingest migrate\n  webhook-ingest migrate --json"
    )]
    Migrate {
        /// One JSON object on stdout: the versions applied and the schema's version.
        #[arg(long)]
        json: bool,
    },
    /// Recorded events, for operators.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List recorded events, newest first.
    #[command(
        after_help = "Examples:\n  webhook-ingest events list --status unmatched --since 24h\n  webhook-ingest events list --id 'evt_2026_*' --limit 20 --json"
    )]
    List {
        /// Only events with this status (processed, refunded, ignored,
        /// unmatched, already_paid, order_refunded, discarded; any case).
        #[arg(long, value_parser = parse_status)]
        status: Option<domain::EventOutcome>,
        /// Only this event id; with a trailing `*`, the ids that start with
        /// what precedes it (evt_2026_*).
        #[arg(long)]
        id: Option<String>,
        /// Only events first delivered this recently (90s, 30m, 6h, 7d).
        #[arg(long, value_parser = process::args::parse_duration)]
        since: Option<Duration>,
        /// The next page: the events listed after this one (the last event
        /// id of the previous page).
        #[arg(long, value_name = "EVENT_ID")]
        after: Option<String>,
        /// JSON lines on stdout, one event per line.
        #[arg(long)]
        json: bool,
        /// At most this many events.
        #[arg(long, default_value_t = 100, allow_negative_numbers = true,
              value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
    },
    /// One event's whole story: its deliveries, stored answer, status and
    /// trace, and its order's commands with their state, attempts and last
    /// error.
    #[command(
        after_help = "Examples:\n  webhook-ingest events show evt_1K9x\n  webhook-ingest events show evt_1K9x --json"
    )]
    Show {
        /// The event id, as the provider sent it.
        id: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Apply an event recorded `unmatched` to its order, now that an order
    /// has its payment id: at most once, however many replays and
    /// deliveries race it.
    #[command(after_help = "Examples:\n  webhook-ingest events replay evt_1K9x")]
    Replay {
        /// The event id, as the provider sent it.
        id: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Discard an event recorded `unmatched` that will never match, with a
    /// reason: it is no longer applied by itself or alerted on, and its row
    /// stays, with the reason, as the audit of the decision.
    #[command(
        after_help = "Examples:\n  webhook-ingest events discard evt_1K9x --reason 'a test payment: no order will come'"
    )]
    Discard {
        /// The event id, as the provider sent it.
        id: String,
        /// Why it will never match (kept on the event's row).
        #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
        reason: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// An event status as typed: `unmatched`, `Unmatched`.
fn parse_status(text: &str) -> Result<domain::EventOutcome, String> {
    domain::EventOutcome::parse(&text.to_ascii_lowercase()).ok_or_else(|| {
        let known: Vec<_> = domain::EventOutcome::ALL.iter().map(|o| o.as_str()).collect();
        format!("unknown status `{text}` ({})", known.join(", "))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemeArg {
    Standard,
    Stripe,
}

impl From<SchemeArg> for Scheme {
    fn from(s: SchemeArg) -> Self {
        match s {
            SchemeArg::Standard => Scheme::Standard,
            SchemeArg::Stripe => Scheme::Stripe,
        }
    }
}

/// Everything `webhook-ingest` is configured with. `Debug` is safe to log:
/// the database URL and the signing secrets print `[redacted]`.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Connections in the pool. Size it for the database's cores, not for
    /// the number of clients: beyond ~16 a 2-core server gets slower.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub database_pool_size: u32,

    /// Webhook traffic only.
    #[arg(long, env = "INGEST_LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub ingest_listen_addr: SocketAddr,

    #[command(flatten)]
    pub admin: AdminArgs<{ process::args::INGEST_ADMIN_PORT }>,

    #[arg(
        long,
        env = "WEBHOOK_SIGNATURE_SCHEME",
        value_enum,
        default_value = "standard"
    )]
    pub webhook_signature_scheme: SchemeArg,

    /// The signing secrets, comma-separated; several may be active at once
    /// during a rotation. Standard scheme: each `whsec_` and base64, as the
    /// provider shows it, decoding to at least 16 bytes. Stripe scheme: each
    /// used as it is, at least 16 bytes.
    #[arg(long, env = "WEBHOOK_SECRETS", hide_env_values = true)]
    pub webhook_secrets: Option<Secret<String>>,

    /// How far a signature's timestamp may be from now, in either direction.
    #[arg(long, env = "WEBHOOK_TOLERANCE_SECS", default_value_t = signature::DEFAULT_TOLERANCE_SECS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub webhook_tolerance_secs: u64,

    /// The whole handler, body read and database included. Well under any
    /// provider's timeout (commonly 10 to 30 s): a slow dependency yields a
    /// clean 503 the provider retries, never a 200 after it gave up.
    #[arg(long, env = "INGEST_DEADLINE_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=120_000))]
    pub ingest_deadline_ms: u64,

    /// Requests handled at once; beyond it, a request is answered 503 with
    /// Retry-After at once instead of queueing for a database connection.
    /// Load shedding: under overload, memory and latency stay bounded and the
    /// provider retries later, instead of every request waiting out its
    /// deadline. Four times as many bodies are read at once, over as many
    /// connections held; more wait in the listen backlog.
    #[arg(long, env = "INGEST_MAX_IN_FLIGHT", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub ingest_max_in_flight: u32,

    /// How long after its first delivery an `unmatched` event is applied by
    /// itself once its order exists: the provider's retry horizon (72 h for
    /// the common providers), within which the event could equally have
    /// arrived after the order. Past it, the event raises an alert and waits
    /// for an operator (`events replay` or `events discard`); retention never
    /// deletes it.
    #[arg(long, env = "UNMATCHED_HORIZON_HOURS", default_value_t = 72,
          value_parser = clap::value_parser!(u64).range(1..=8_760))]
    pub unmatched_horizon_hours: u64,

    #[command(flatten)]
    pub log: LogArgs,
}

impl Settings {
    /// `INGEST_DEADLINE_MS`, and the bounds derived from it.
    pub fn deadline(&self) -> crate::record::Deadline {
        crate::record::Deadline::new(Duration::from_millis(self.ingest_deadline_ms))
    }

    /// [`Settings::unmatched_horizon_hours`] as a duration.
    pub fn unmatched_horizon(&self) -> Duration {
        Duration::from_secs(self.unmatched_horizon_hours * 3600)
    }

    pub fn webhook_signature_scheme_name(&self) -> &'static str {
        Scheme::from(self.webhook_signature_scheme).as_str()
    }

    /// `DATABASE_URL`, which every command needs.
    pub fn database(&self) -> Result<db::Database, String> {
        self.database.parse_url()
    }

    /// The verifier from `WEBHOOK_SIGNATURE_SCHEME` and `WEBHOOK_SECRETS`;
    /// every secret's key at least [`MIN_SECRET_BYTES`] long.
    pub fn verifier(&self) -> Result<signature::Verifier, String> {
        let secrets = self
            .webhook_secrets
            .as_ref()
            .ok_or("WEBHOOK_SECRETS is required (comma-separated signing secrets)")?;
        signature::Verifier::with_min_key_bytes(
            self.webhook_signature_scheme.into(),
            secrets.expose(),
            self.webhook_tolerance_secs,
            MIN_SECRET_BYTES,
        )
        .map_err(|e| format!("WEBHOOK_SECRETS: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn settings_never_print_their_secrets() {
        let password = "pa55w0rd-of-the-ingest";
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let url = format!("postgres://webhook_ingest:{password}@db:5432/payments");
        let cli = Cli::try_parse_from([
            "webhook-ingest",
            "--database-url",
            &url,
            "--webhook-secrets",
            secret,
        ])
        .unwrap();
        for shown in [
            format!("{:?}", cli.settings),
            format!("{:#?}", cli.settings),
            format!("{cli:?}"),
        ] {
            assert!(!shown.contains(password), "the database password leaked: {shown}");
            assert!(!shown.contains("MfKQ9r8G"), "a signing secret leaked: {shown}");
        }
        // Still usable by the code that needs them.
        assert_eq!(cli.settings.database().unwrap().describe(), "db:5432/payments");
        assert!(cli.settings.verifier().is_ok());
    }
}
