//! How the provider signs, shared by `simulator provider` and `simulator send`.

use signature::{Scheme, Secret};

/// How the provider signs, shared by `provider` and `send`.
#[derive(Debug, Clone, clap::Args)]
pub struct SigningArgs {
    /// The signing secret, as the ingest's WEBHOOK_SECRETS has it
    /// (`whsec_<base64>` for standard, any string for stripe).
    #[arg(
        long,
        env = "PROVIDER_SECRET",
        value_name = "PROVIDER_SECRET",
        hide_env_values = true
    )]
    pub secret: String,

    /// Signature scheme: standard (Standard Webhooks) or stripe.
    #[arg(long, env = "PROVIDER_SCHEME", value_name = "PROVIDER_SCHEME", default_value = "standard",
          value_parser = parse_scheme)]
    pub scheme: Scheme,
}

impl SigningArgs {
    /// The parsed secret; fails naming the flag and its variable.
    pub fn secret(&self) -> Result<Secret, String> {
        Secret::parse(self.scheme, &self.secret).map_err(|e| format!("--secret (PROVIDER_SECRET): {e}"))
    }
}

fn parse_scheme(s: &str) -> Result<Scheme, String> {
    Scheme::parse(s).ok_or_else(|| format!("{s:?} is not a scheme: standard or stripe"))
}
