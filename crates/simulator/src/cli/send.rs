//! `simulator send`: one event, by hand.

use reqwest::Url;

use super::SigningArgs;

#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// The order's payment id (`pay_42` is order 42 in `make run`).
    pub payment_id: String,

    /// The event's type.
    #[arg(long = "type", value_name = "TYPE", default_value = "payment.succeeded")]
    pub event_type: String,

    /// The event id, the ingest's dedup key (default: a new evt_hand_<random>);
    /// send one again to see the stored answer replayed.
    #[arg(long)]
    pub id: Option<String>,

    /// The amount, in minor units.
    #[arg(long, default_value_t = 4200)]
    pub amount: i64,

    /// The ingest (a bare base URL gets /webhooks/payments appended).
    #[arg(
        long,
        env = "PROVIDER_TARGET",
        value_name = "PROVIDER_TARGET",
        default_value = "http://127.0.0.1:8080"
    )]
    pub target: Url,

    #[command(flatten)]
    pub signing: SigningArgs,
}
