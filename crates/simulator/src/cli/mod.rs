//! The command line: one subcommand per simulated neighbour. Every flag is
//! also an environment variable (named in the flag's value, as in the
//! services, so a configuration error names what to fix).
//!
//! # Layout
//! One module per subcommand's arguments, each with the conversion into its
//! library configuration: [`downstream`], [`provider`], [`proxy`], [`send`],
//! [`audit`]; [`signing`] is shared by `provider` and `send`. Here: the
//! subcommands and the value parsers several of them use.

pub mod audit;
pub mod downstream;
pub mod provider;
pub mod proxy;
pub mod send;
pub mod signing;

use clap::{Parser, Subcommand};

pub use audit::AuditArgs;
pub use downstream::DownstreamArgs;
pub use provider::ProviderArgs;
pub use proxy::ProxyArgs;
pub use send::SendArgs;
pub use signing::SigningArgs;

#[derive(Debug, Parser)]
#[command(
    name = "simulator",
    version,
    about = "Simulated neighbours for tests, make run and make bench."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The downstream fulfilment (POST /shipments) and email (POST /emails)
    /// APIs, with idempotency keys and injected faults. Prints
    /// {"listening":"ADDR"} on stdout once bound, then serves until SIGTERM.
    Downstream(DownstreamArgs),
    /// The payment provider and load generator: signs events, delivers them
    /// to the ingest at least once (retries, duplicates, bursts), prints
    /// progress and a summary on stderr (and with --json the summary as one
    /// line on stdout). Exit 0 only if every event was acknowledged.
    Provider(ProviderArgs),
    /// A fault-injecting TCP proxy (delays, cuts, black holes, refusals) in
    /// front of --upstream, with faults changed at runtime by POST /faults
    /// on --control. Prints {"listening":"ADDR","control":"ADDR"} on stdout
    /// once bound, then forwards until SIGTERM.
    Proxy(ProxyArgs),
    /// One signed webhook, posted once, by hand: prints the status (with
    /// `Idempotent-Replayed: true` on a replay) and the ingest's answer.
    /// Exit 0 on a 2xx, 1 otherwise.
    Send(SendArgs),
    /// The product's promise checked after a run: the downstream's own
    /// records (GET /stats with keys) against the database. In totals, every
    /// command in the outbox had exactly one effect; per order, its shipment,
    /// confirmation and refund notice follow the rules. Prints the totals, a
    /// table of rules with a count and example order ids each, and the
    /// "exactly once" line; exit 0 if both held, 1 otherwise.
    Audit(AuditArgs),
}

pub(crate) fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{s:?} is not a rate between 0 and 1")),
    }
}
