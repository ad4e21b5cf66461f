//! Values that must never reach a log line, an error message or a panic:
//! webhook signing secrets, and database URLs (they may carry a password).
//!
//! A [`Secret`] prints `[redacted]` whichever way it is formatted, so a
//! `Settings` struct holding one can derive `Debug` and be logged or
//! `dbg!`-ed whole. The value is reached only through [`Secret::expose`],
//! whose name makes every use easy to find and review.
//!
//! Clap parses a `Secret<String>` like a `String` (`hide_env_values = true`
//! beside it keeps `--help` from showing the variable's value).

use std::fmt;
use std::str::FromStr;

/// A value that formats as `[redacted]`.
///
/// No `PartialEq`: comparing secrets belongs to the code that verifies them,
/// in constant time (the `signature` crate), not to a derived `==`.
#[derive(Clone, Default)]
pub struct Secret<T = String>(T);

/// What a [`Secret`] prints instead of its value.
pub const REDACTED: &str = "[redacted]";

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The value itself, for the one place that needs it (a parser, a
    /// verifier): never for a log line or an error message.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T: FromStr> FromStr for Secret<T> {
    type Err = T::Err;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_is_redacted() {
        let secret = Secret::new(String::from("hunter2"));
        for shown in [
            format!("{secret}"),
            format!("{secret:?}"),
            format!("{secret:#?}"),
            format!("{:?}", Some(&secret)),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn parses_like_its_value() {
        let secret: Secret<String> = "whsec_abc".parse().unwrap();
        assert_eq!(secret.expose(), "whsec_abc");
        let port: Secret<u16> = "5432".parse().unwrap();
        assert_eq!(*port.expose(), 5432);
    }
}
