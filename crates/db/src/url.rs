//! Reading `DATABASE_URL`: libpq's URL and `key=value` forms, with libpq's
//! `sslmode` values.
//!
//! tokio-postgres understands `sslmode=disable|prefer|require` but neither
//! certificate verification nor `sslrootcert`; managed databases are reached
//! with libpq's `verify-full`. So `sslmode` and `sslrootcert` are taken out of
//! the URL here and turned into a [`ServerCertificate`] check (which
//! [`crate::tls`] makes a rustls configuration of); the rest goes to
//! tokio-postgres as is.
//!
//! | sslmode | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | no | - |
//! | `prefer` (default) | if the server offers it | no |
//! | `require` | yes | no (against `sslrootcert` if one is given, as libpq does) |
//! | `verify-ca` | yes | chain to `sslrootcert` |
//! | `verify-full` | yes | chain to `sslrootcert`, and the host name |

use tokio_postgres::config::SslMode;

/// Why `DATABASE_URL` is unusable. The text never repeats the URL (it may
/// hold a password).
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    #[error("is empty")]
    Empty,
    #[error("has an invalid sslmode `{0}` (disable, prefer, require, verify-ca, verify-full)")]
    SslMode(String),
    #[error("sets sslmode={0} without sslrootcert=<CA file>")]
    MissingRootCert(&'static str),
    #[error("names a CA file that cannot be read ({0})")]
    RootCert(String),
    #[error("cannot be parsed: {0}")]
    Invalid(String),
}

/// What is checked of the certificate a server presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerCertificate {
    /// Nothing: encryption without authentication, as libpq's `prefer` and
    /// `require` (without `sslrootcert`).
    Unchecked,
    /// Its chain leads to a CA of the `root_cert` file; with `check_name`,
    /// it also names the host connected to.
    Verified { root_cert: String, check_name: bool },
}

/// A `DATABASE_URL`, read: what tokio-postgres is given, and what the TLS
/// configuration must check.
#[derive(Debug)]
pub(crate) struct ParsedUrl {
    pub config: tokio_postgres::Config,
    pub server_certificate: ServerCertificate,
}

/// Reads a URL or `key=value` connection string.
pub(crate) fn parse(url: &str) -> Result<ParsedUrl, DatabaseUrlError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(DatabaseUrlError::Empty);
    }
    let (rest, sslmode, root_cert) = take_tls_params(url);
    // The chain is verified for `verify-ca` and `verify-full`, and for
    // `require` when a CA file is given; `.1` says whether the name is too.
    let (mode, verify) = match sslmode.as_deref() {
        None | Some("prefer" | "allow") => (SslMode::Prefer, None),
        Some("disable") => (SslMode::Disable, None),
        Some("require") if root_cert.is_some() => (SslMode::Require, Some(("require", false))),
        Some("require") => (SslMode::Require, None),
        Some("verify-ca") => (SslMode::Require, Some(("verify-ca", false))),
        Some("verify-full") => (SslMode::Require, Some(("verify-full", true))),
        Some(other) => return Err(DatabaseUrlError::SslMode(other.to_owned())),
    };
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| DatabaseUrlError::Invalid(e.to_string()))?;
    config.ssl_mode(mode);
    let server_certificate = match verify {
        None => ServerCertificate::Unchecked,
        Some((sslmode, check_name)) => ServerCertificate::Verified {
            root_cert: root_cert.ok_or(DatabaseUrlError::MissingRootCert(sslmode))?,
            check_name,
        },
    };
    Ok(ParsedUrl {
        config,
        server_certificate,
    })
}

/// Splits `sslmode` and `sslrootcert` out of a URL or key=value string.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let mut sslmode = None;
    let mut rootcert = None;
    let mut take = |key: &str, value: &str| match key {
        "sslmode" => {
            sslmode = Some(value.to_owned());
            true
        }
        "sslrootcert" => {
            rootcert = Some(value.to_owned());
            true
        }
        _ => false,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), None, None);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k, &percent_decode(v))
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, sslmode, rootcert)
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k.trim(), v.trim().trim_matches('\''))
            })
            .collect();
        (kept.join(" "), sslmode, rootcert)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_params_are_taken_out_of_urls() {
        let (rest, mode, root) = take_tls_params(
            "postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, root) = take_tls_params("postgres://h/db?sslmode=require");
        assert_eq!(
            (rest.as_str(), mode.as_deref(), root),
            ("postgres://h/db", Some("require"), None)
        );
        let (rest, mode, _) = take_tls_params("host=h dbname=d sslmode=disable");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("host=h dbname=d", Some("disable"))
        );
    }

    #[test]
    fn sslmode_decides_what_is_checked_of_the_server_certificate() {
        let check = |url: &str| parse(url).unwrap().server_certificate;
        assert_eq!(check("postgres://h/db"), ServerCertificate::Unchecked);
        assert_eq!(
            check("postgres://h/db?sslmode=require"),
            ServerCertificate::Unchecked
        );
        let verified = |check_name| ServerCertificate::Verified {
            root_cert: "/ca.pem".into(),
            check_name,
        };
        assert_eq!(
            check("postgres://h/db?sslmode=require&sslrootcert=/ca.pem"),
            verified(false)
        );
        assert_eq!(
            check("postgres://h/db?sslmode=verify-ca&sslrootcert=/ca.pem"),
            verified(false)
        );
        assert_eq!(
            check("postgres://h/db?sslmode=verify-full&sslrootcert=/ca.pem"),
            verified(true)
        );
        let mode = |url: &str| parse(url).unwrap().config.get_ssl_mode();
        assert_eq!(mode("postgres://h/db?sslmode=disable"), SslMode::Disable);
        assert_eq!(mode("postgres://h/db?sslmode=allow"), SslMode::Prefer);
        assert_eq!(
            mode("postgres://h/db?sslmode=verify-full&sslrootcert=/x"),
            SslMode::Require
        );
    }
}
