//! Configuration: every setting is an environment variable and the matching
//! kebab-case flag; an invalid value stops the process with one line naming
//! the variable (exit 2). The console is off unless `CONSOLE_LISTEN_ADDR`
//! names an address and `CONSOLE_TOKEN` a token; its actions are off unless
//! `CONSOLE_ACTIONS=on`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use process::args::CONSOLE_ADMIN_PORT;
use process::{AdminArgs, DatabaseArgs, LogArgs, Secret};

/// The shortest token accepted: a guessable one is no login at all.
pub const MIN_TOKEN_BYTES: usize = 16;

#[derive(Debug, Parser)]
#[command(
    name = "ops-console",
    version,
    about = "The operator's console in the browser: search an event's story, triage dead letters, settle unmatched payments.",
    after_help = "Examples:\n  CONSOLE_LISTEN_ADDR=127.0.0.1:8080 CONSOLE_TOKEN=$(cat token) DATABASE_URL=postgres://... ops-console\n  ops-console --console-actions on --console-trace-url 'https://jaeger.example/trace/{trace_id}'"
)]
pub struct Settings {
    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub admin: AdminArgs<CONSOLE_ADMIN_PORT>,

    /// Where the console's pages are served (such as 127.0.0.1:8080). Required: the console is off
    /// unless it is set.
    #[arg(long, env = "CONSOLE_LISTEN_ADDR")]
    pub console_listen_addr: Option<SocketAddr>,

    /// The token an operator signs in with (16 bytes at least), from a Secret.
    #[arg(long, env = "CONSOLE_TOKEN", hide_env_values = true)]
    pub console_token: Option<Secret<String>>,

    /// Whether the pages offer, and the console accepts, the actions (requeue, discard, replay).
    #[arg(long, env = "CONSOLE_ACTIONS", value_enum, default_value = "off")]
    pub console_actions: Actions,

    /// The trace viewer's address for one trace, `{trace_id}` where the id goes
    /// (https://jaeger.example/trace/{trace_id}). Unset: trace ids are shown, not linked.
    #[arg(long, env = "CONSOLE_TRACE_URL")]
    pub console_trace_url: Option<String>,

    /// `secure`: the session cookie is sent over HTTPS only (behind TLS or the auth proxy).
    /// `plain-http`: also over plain HTTP, for a console reached on loopback only.
    #[arg(long, env = "CONSOLE_COOKIE", value_enum, default_value = "secure")]
    pub console_cookie: CookieTransport,

    /// The header the auth proxy in front names the signed-in person with (X-Forwarded-Email with
    /// oauth2-proxy's --pass-user-headers): the operator's name at sign-in is taken from it, not
    /// typed. Set it only where nothing but the proxy reaches the console (its NetworkPolicy).
    #[arg(long, env = "CONSOLE_OPERATOR_HEADER")]
    pub console_operator_header: Option<String>,

    /// How long a sign-in lasts (90s, 30m, 8h, 1d).
    #[arg(long, env = "CONSOLE_SESSION_TTL", default_value = "8h",
          value_parser = process::args::parse_duration)]
    pub console_session_ttl: Duration,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Whether the console changes anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Actions {
    /// Read only: no action is offered, every action is refused (403).
    Off,
    /// Requeue and discard dead letters, replay and discard unmatched payments.
    On,
}

/// Which connections the session cookie travels over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CookieTransport {
    Secure,
    PlainHttp,
}

/// The settings checked together: what serving needs.
#[derive(Debug, Clone)]
pub struct Console {
    pub listen: SocketAddr,
    pub token: Secret<String>,
    pub actions: Actions,
    pub trace_url: Option<String>,
    pub cookie: CookieTransport,
    pub session_ttl: Duration,
    /// Where the operator's name comes from.
    pub operator: OperatorName,
}

/// Where the name an action is logged with comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorName {
    /// Typed at sign-in.
    Typed,
    /// This request header, set by the auth proxy.
    FromHeader(actix_web::http::header::HeaderName),
}

impl Settings {
    /// The console's own settings, or the one line that says which is wrong.
    pub fn console(&self) -> Result<Console, String> {
        let listen = self.console_listen_addr.ok_or(
            "CONSOLE_LISTEN_ADDR is required: the console is off unless it names an address (such as 127.0.0.1:8080)",
        )?;
        let token = self
            .console_token
            .clone()
            .ok_or("CONSOLE_TOKEN is required: the token operators sign in with (from a Secret)")?;
        if token.expose().trim().len() < MIN_TOKEN_BYTES {
            return Err(format!(
                "CONSOLE_TOKEN is too short ({MIN_TOKEN_BYTES} bytes at least; `openssl rand -hex 32` makes one)"
            ));
        }
        if let Some(url) = &self.console_trace_url
            && (!url.contains("{trace_id}") || !(url.starts_with("https://") || url.starts_with("http://")))
        {
            return Err(
                "CONSOLE_TRACE_URL must be an http(s) address with `{trace_id}` where the id goes".into(),
            );
        }
        let operator = match &self.console_operator_header {
            None => OperatorName::Typed,
            Some(name) => OperatorName::FromHeader(
                actix_web::http::header::HeaderName::from_bytes(name.trim().as_bytes())
                    .map_err(|_| format!("CONSOLE_OPERATOR_HEADER `{name}` is not a header name"))?,
            ),
        };
        if self.console_session_ttl.is_zero() {
            return Err("CONSOLE_SESSION_TTL must be longer than 0".into());
        }
        Ok(Console {
            listen,
            token,
            actions: self.console_actions,
            trace_url: self.console_trace_url.clone(),
            cookie: self.console_cookie,
            session_ttl: self.console_session_ttl,
            operator,
        })
    }
}
