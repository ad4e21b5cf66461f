//! Configuration: every setting is an environment variable and the matching
//! kebab-case flag; invalid values stop the process with one line naming the
//! variable (exit 2). The settings every service shares (database, admin
//! listener, log format) are `process::args` groups, flattened here.

use std::time::Duration;

use clap::{Parser, Subcommand};
use process::{AdminArgs, DatabaseArgs, LogArgs, Secret};

use crate::downstream::Downstream;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Drains the outbox: claims due rows under a lease, calls the downstream APIs with idempotency keys, retries, dead-letters."
)]
pub struct Cli {
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker (the default).
    ///
    /// Its settings are the top-level flags and variables (`outbox-relay
    /// --help`): flags go before `run`. `serve` is the same command, as it
    /// is the ingest's.
    #[command(
        after_help = "Examples:\n  DATABASE_URL=postgres://... FULFILMENT_URL=http://... EMAIL_URL=http://... outbox-relay\n  outbox-relay --relay-batch-size 100 run"
    )]
    #[command(alias = "serve")]
    Run,
    /// Dead rows: list or show them, put them back to pending, or discard them.
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// Rows by status and kind, and the oldest pending row's age.
    #[command(after_help = "Examples:\n  outbox-relay stats\n  outbox-relay stats --json")]
    Stats {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Delete done and cancelled rows and processed events older than RETENTION_DAYS, in small batches.
    ///
    /// A line on stderr every few seconds while it runs (rows deleted so far
    /// per table, batches, elapsed), then the summary on stdout.
    #[command(after_help = "Examples:\n  RETENTION_DAYS=7 outbox-relay prune\n  outbox-relay prune --json")]
    Prune {
        /// The summary as one JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// How often the progress line is printed (0: after every batch).
        #[arg(long, hide = true, default_value = "5s", value_parser = process::args::parse_duration)]
        progress_every: Duration,
    },
    /// After an incident: deliveries, duplicates, and commands enqueued and
    /// delivered by kind, as the database recorded them.
    #[command(
        after_help = "Examples:\n  outbox-relay audit --since 6h\n  outbox-relay audit --since 7d --json"
    )]
    Audit {
        /// The window: events processed and commands enqueued this recently (90s, 30m, 6h, 7d).
        #[arg(long, default_value = "24h", value_parser = process::args::parse_duration)]
        since: Duration,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// Dead rows with their last error, oldest first.
    #[command(
        after_help = "Examples:\n  outbox-relay dead list --kind ship_order\n  outbox-relay dead list --after 597 --json"
    )]
    List {
        /// Only rows of this kind (ship_order, send_confirmation, send_refund_notice, or any other a row has).
        #[arg(long)]
        kind: Option<String>,
        /// At most this many rows (1 to 100000).
        #[arg(long, default_value_t = 100, allow_negative_numbers = true,
              value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
        /// The next page: the rows after this id (the last of the previous page).
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
        /// JSON lines on stdout, one row per line.
        #[arg(long)]
        json: bool,
    },
    /// One outbox row, whole (of any status): what it sends, its state, attempts, last error, times, trace.
    #[command(after_help = "Examples:\n  outbox-relay dead show 597")]
    Show {
        /// The row's id.
        id: i64,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Back to pending, due now, attempts reset; prints each row it put back.
    #[command(group(clap::ArgGroup::new("rows").required(true).args(["id", "all"])))]
    #[command(
        after_help = "Examples:\n  outbox-relay dead requeue 597\n  outbox-relay dead requeue --all --kind ship_order --dry-run"
    )]
    Requeue {
        /// The row's id.
        #[arg(conflicts_with_all = ["all", "kind"])]
        id: Option<i64>,
        /// Every dead row (of --kind, if given).
        #[arg(long)]
        all: bool,
        /// With --all: only rows of this kind.
        #[arg(long, requires = "all")]
        kind: Option<String>,
        /// Print the rows it would put back, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// JSON lines on stdout, one row per line.
        #[arg(long)]
        json: bool,
    },
    /// End a dead row as cancelled, with the reason, kept for the audit (until retention).
    #[command(after_help = "Examples:\n  outbox-relay dead discard 597 --reason 'order cancelled by phone'")]
    Discard {
        /// The row's id.
        id: i64,
        /// Why it is not to be sent (stored in its last_error; at most 500 characters).
        #[arg(long, value_parser = parse_reason)]
        reason: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// A `dead discard` reason: some text, at most 500 characters.
fn parse_reason(text: &str) -> Result<String, String> {
    let text = text.trim();
    match text.chars().count() {
        0 => Err("give a reason: it is kept with the row, for whoever audits it".to_owned()),
        1..=500 => Ok(text.to_owned()),
        n => Err(format!("{n} characters; at most 500")),
    }
}

/// Everything `outbox-relay` is configured with. `Debug` is safe to log: the
/// database URLs, the downstream URLs (which may hold a password) and the
/// downstream credentials print `[redacted]`.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    // Behind PgBouncer in transaction mode, LISTEN needs
    // RELAY_LISTEN_DATABASE_URL (direct) or RELAY_LISTEN=false.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Connections in the pool: claims and completions are short, a few suffice.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool_size: u32,

    #[command(flatten)]
    pub admin: AdminArgs<{ process::args::RELAY_ADMIN_PORT }>,

    /// Base URL of the fulfilment API (POST {FULFILMENT_URL}/shipments). A
    /// user and password in it are sent as HTTP Basic credentials.
    #[arg(long, env = "FULFILMENT_URL", hide_env_values = true)]
    pub fulfilment_url: Option<Secret<String>>,

    /// The fulfilment API's `Authorization` header, sent verbatim on every
    /// call (`Bearer ...`, `Basic ...`); unset, none is sent.
    #[arg(long, env = "FULFILMENT_AUTHORIZATION", hide_env_values = true)]
    pub fulfilment_authorization: Option<Secret<String>>,

    /// Base URL of the email API (POST {EMAIL_URL}/emails). A user and
    /// password in it are sent as HTTP Basic credentials.
    #[arg(long, env = "EMAIL_URL", hide_env_values = true)]
    pub email_url: Option<Secret<String>>,

    /// The email API's `Authorization` header, sent verbatim on every call;
    /// unset, none is sent.
    #[arg(long, env = "EMAIL_AUTHORIZATION", hide_env_values = true)]
    pub email_authorization: Option<Secret<String>>,

    /// Rows claimed per claim statement.
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub relay_batch_size: u32,

    /// Downstream calls in flight per process.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub relay_concurrency: u32,

    /// How long a claimed row is ours. Must exceed the HTTP timeout, or a
    /// slow call could see its row claimed (and sent) by another relay.
    #[arg(long, env = "RELAY_LEASE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub relay_lease_secs: u64,

    /// Per downstream request, connection included.
    #[arg(long, env = "RELAY_HTTP_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub relay_http_timeout_ms: u64,

    /// Calls per row before it is dead.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 25,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub relay_max_attempts: u32,

    /// First retry delay (before jitter); doubles per attempt.
    #[arg(long, env = "RELAY_BACKOFF_BASE_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub relay_backoff_base_ms: u64,

    /// Longest retry delay, Retry-After included.
    #[arg(long, env = "RELAY_BACKOFF_MAX_SECS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub relay_backoff_max_secs: u64,

    /// Fallback polling; LISTEN/NOTIFY wakes the relay at once.
    #[arg(long, env = "RELAY_POLL_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub relay_poll_interval_ms: u64,

    /// Wake on NOTIFY (true), or poll only (false: behind a pooler without a direct connection).
    #[arg(long, env = "RELAY_LISTEN", default_value_t = true, action = clap::ArgAction::Set)]
    pub relay_listen: bool,

    /// A direct (not pooled) connection for LISTEN, when DATABASE_URL goes through PgBouncer in transaction mode.
    #[arg(long, env = "RELAY_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub relay_listen_database_url: Option<Secret<String>>,

    /// Lease holder name (a random suffix is added per process); defaults to the host name.
    #[arg(long, env = "RELAY_ID")]
    pub relay_id: Option<String>,

    /// Done rows and processed events are kept this long. Providers retry for
    /// up to 3 days; a week keeps every possible redelivery deduplicated.
    #[arg(long, env = "RETENTION_DAYS", default_value_t = 7,
          value_parser = clap::value_parser!(u32).range(1..=3650), global = true)]
    pub retention_days: u32,

    /// How often the worker prunes on its own (one replica at a time); 0 disables.
    #[arg(long, env = "RELAY_PRUNE_INTERVAL_SECS", default_value_t = 600)]
    pub relay_prune_interval_secs: u64,

    #[command(flatten)]
    pub log: LogArgs,
}

/// The checked settings the worker runs with.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub fulfilment: Downstream,
    pub email: Downstream,
    pub batch_size: u32,
    pub concurrency: u32,
    pub lease: Duration,
    pub http_timeout: Duration,
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub poll_interval: Duration,
    pub listen: bool,
    pub retention_days: u32,
    pub prune_interval: Option<Duration>,
    pub owner: String,
}

impl Settings {
    /// `DATABASE_URL`, which every command needs.
    pub fn database(&self) -> Result<db::Database, String> {
        self.database.parse_url()
    }

    /// `RELAY_LISTEN_DATABASE_URL`, when LISTEN has a connection of its own.
    pub fn listen_database(&self) -> Result<Option<db::Database>, String> {
        self.relay_listen_database_url
            .as_ref()
            .map(|url| {
                db::Database::parse(url.expose()).map_err(|e| format!("RELAY_LISTEN_DATABASE_URL {e}"))
            })
            .transpose()
    }

    /// Everything the worker needs, checked together.
    pub fn relay(&self) -> Result<RelayConfig, String> {
        let fulfilment = Downstream::new(
            self.fulfilment_url.as_ref(),
            self.fulfilment_authorization.as_ref(),
            "FULFILMENT",
        )?;
        let email = Downstream::new(
            self.email_url.as_ref(),
            self.email_authorization.as_ref(),
            "EMAIL",
        )?;
        if self.relay_lease_secs * 1000 <= self.relay_http_timeout_ms {
            return Err(format!(
                "RELAY_LEASE_SECS ({} s) must be longer than RELAY_HTTP_TIMEOUT_MS ({} ms): \
                 a call outliving its lease could be sent again by another relay",
                self.relay_lease_secs, self.relay_http_timeout_ms
            ));
        }
        if self.relay_backoff_base_ms > self.relay_backoff_max_secs * 1000 {
            return Err(format!(
                "RELAY_BACKOFF_BASE_MS ({}) must not exceed RELAY_BACKOFF_MAX_SECS ({} s)",
                self.relay_backoff_base_ms, self.relay_backoff_max_secs
            ));
        }
        let owner = format!(
            "{}-{:06x}",
            self.relay_id.clone().unwrap_or_else(host_name),
            rand::random::<u32>() & 0xff_ffff
        );
        Ok(RelayConfig {
            fulfilment,
            email,
            batch_size: self.relay_batch_size,
            concurrency: self.relay_concurrency,
            lease: Duration::from_secs(self.relay_lease_secs),
            http_timeout: Duration::from_millis(self.relay_http_timeout_ms),
            max_attempts: self.relay_max_attempts,
            backoff_base: Duration::from_millis(self.relay_backoff_base_ms),
            backoff_max: Duration::from_secs(self.relay_backoff_max_secs),
            poll_interval: Duration::from_millis(self.relay_poll_interval_ms),
            listen: self.relay_listen,
            retention_days: self.retention_days,
            prune_interval: (self.relay_prune_interval_secs > 0)
                .then(|| Duration::from_secs(self.relay_prune_interval_secs)),
            owner,
        })
    }
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".into())
}

#[cfg(test)]
mod tests;
