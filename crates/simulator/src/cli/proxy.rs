//! `simulator proxy`: where it listens and forwards, its control address,
//! its initial faults.

use std::net::SocketAddr;

use process::LogFormat;

use super::parse_rate;
use crate::proxy::{self, ProxyConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Where clients connect; port 0 picks a free port (printed on stdout).
    #[arg(
        long,
        env = "PROXY_LISTEN",
        value_name = "PROXY_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub listen: SocketAddr,

    /// Where connections are forwarded (IP:PORT).
    #[arg(long, env = "PROXY_UPSTREAM", value_name = "PROXY_UPSTREAM")]
    pub upstream: SocketAddr,

    /// The control endpoints (GET|POST /faults, GET /stats); port 0 picks a
    /// free port (printed on stdout).
    #[arg(
        long,
        env = "PROXY_CONTROL",
        value_name = "PROXY_CONTROL",
        default_value = "127.0.0.1:0"
    )]
    pub control: SocketAddr,

    /// Each chunk is held back this long, both ways.
    #[arg(
        long,
        env = "PROXY_DELAY_MS",
        value_name = "PROXY_DELAY_MS",
        default_value_t = 0
    )]
    pub delay_ms: u64,

    /// Cut connections (RST both sides) once this many bytes came from
    /// upstream; 0: as soon as the answer starts. Every connection, unless
    /// --cut-rate picks a share.
    #[arg(long, env = "PROXY_CUT_AFTER_BYTES", value_name = "PROXY_CUT_AFTER_BYTES")]
    pub cut_after_bytes: Option<u64>,

    /// Share of new connections cut (after --cut-after-bytes, default 0).
    #[arg(long, env = "PROXY_CUT_RATE", value_name = "PROXY_CUT_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub cut_rate: f64,

    /// Share of new connections black-holed: read, never forwarded, never answered.
    #[arg(long, env = "PROXY_BLACKHOLE_RATE", value_name = "PROXY_BLACKHOLE_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub blackhole_rate: f64,

    /// Black-hole every connection, open ones included.
    #[arg(long, env = "PROXY_BLACKHOLE")]
    pub blackhole: bool,

    /// Refuse connections (the listener is closed) and reset open ones.
    #[arg(long, env = "PROXY_REFUSE")]
    pub refuse: bool,

    /// Logs go to stderr (stdout carries only the listening line).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

impl ProxyArgs {
    /// The library's configuration; fails when the rates add up to more than 1.
    pub fn config(&self) -> Result<ProxyConfig, String> {
        let faults = proxy::Faults {
            delay_ms: self.delay_ms,
            cut_after_bytes: self.cut_after_bytes,
            cut_rate: self.cut_rate,
            blackhole_rate: self.blackhole_rate,
            blackhole: self.blackhole,
            refuse: self.refuse,
        };
        faults.validate().map_err(|e| {
            e.replace("cut_rate", "--cut-rate (PROXY_CUT_RATE)")
                .replace("blackhole_rate", "--blackhole-rate (PROXY_BLACKHOLE_RATE)")
        })?;
        Ok(ProxyConfig {
            listen: self.listen,
            upstream: self.upstream,
            control: Some(self.control),
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn proxy(args: &[&str]) -> Result<ProxyArgs, clap::Error> {
        let mut all = vec!["simulator", "proxy"];
        all.extend(args);
        match Cli::try_parse_from(all)?.command {
            Command::Proxy(args) => Ok(args),
            other => panic!("not proxy: {other:?}"),
        }
    }

    #[test]
    fn proxy_defaults_are_a_fault_free_loopback_proxy() {
        let config = proxy(&["--upstream", "127.0.0.1:7000"])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.upstream, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(config.control, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.faults, proxy::Faults::default());
    }

    #[test]
    fn proxy_fault_flags_reach_the_config() {
        let config = proxy(&[
            "--upstream",
            "127.0.0.1:7000",
            "--listen",
            "127.0.0.1:7001",
            "--control",
            "127.0.0.1:7002",
            "--delay-ms",
            "250",
            "--cut-after-bytes",
            "10",
            "--cut-rate",
            "0.25",
            "--blackhole-rate",
            "0.5",
            "--blackhole",
            "--refuse",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(config.listen.port(), 7001);
        assert_eq!(config.control, Some("127.0.0.1:7002".parse().unwrap()));
        assert_eq!(
            config.faults,
            proxy::Faults {
                delay_ms: 250,
                cut_after_bytes: Some(10),
                cut_rate: 0.25,
                blackhole_rate: 0.5,
                blackhole: true,
                refuse: true,
            }
        );
    }

    #[test]
    fn proxy_errors_name_the_variable() {
        let err = proxy(&[]).unwrap_err();
        assert!(err.to_string().contains("PROXY_UPSTREAM"), "{err}");
        let err = proxy(&["--upstream", "downstream"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_UPSTREAM"), "{err}");
        let err = proxy(&["--upstream", "127.0.0.1:1", "--cut-rate", "2"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_CUT_RATE"), "{err}");
        let err = proxy(&["--upstream", "127.0.0.1:1", "--delay-ms", "soon"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_DELAY_MS"), "{err}");
        let err = proxy(&[
            "--upstream",
            "127.0.0.1:1",
            "--cut-rate",
            "0.6",
            "--blackhole-rate",
            "0.6",
        ])
        .unwrap()
        .config()
        .unwrap_err();
        assert!(
            err.contains("PROXY_CUT_RATE")
                && err.contains("PROXY_BLACKHOLE_RATE")
                && err.contains("at most 1"),
            "{err}"
        );
    }
}
