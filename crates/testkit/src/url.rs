//! Surgery on `postgres://` URLs: the same server reached as another user,
//! in another database or through another port. Tests derive every URL they
//! hand to a service from the one admin URL this way.

/// `url` with its database name replaced.
pub fn url_with_dbname(url: &str, dbname: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| i + scheme_end);
    let mut out = match path_start {
        Some(i) => format!("{}/{dbname}", &base[..i]),
        None => format!("{base}/{dbname}"),
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// `url` logging in as `user` with `password` instead of its own credentials.
pub fn url_with_user(url: &str, user: &str, password: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{}{user}:{password}@{host}", &url[..scheme_end])
}

/// `url` reaching `127.0.0.1:port` (a pooler, say) instead of its own host
/// and port; user, database and parameters unchanged.
pub fn url_with_port(url: &str, port: u16) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (userinfo, _) = match rest[..authority_end].rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..authority_end]),
        None => ("", &rest[..authority_end]),
    };
    format!(
        "{}{userinfo}127.0.0.1:{port}{}",
        &url[..scheme_end],
        &rest[authority_end..]
    )
}

/// The port a URL connects to (5432 when it names none).
pub fn port_of(url: &str) -> u16 {
    let config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    config.get_ports().first().copied().unwrap_or(5432)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbname_replacement() {
        assert_eq!(
            url_with_dbname("postgres://u@h:1/postgres", "x"),
            "postgres://u@h:1/x"
        );
        assert_eq!(url_with_dbname("postgres://u@h:1", "x"), "postgres://u@h:1/x");
        assert_eq!(
            url_with_dbname("postgres://u:p@h/db?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
    }

    #[test]
    fn user_and_port_replacement() {
        assert_eq!(
            url_with_user("postgres://postgres@127.0.0.1:5/db?sslmode=require", "a", "b"),
            "postgres://a:b@127.0.0.1:5/db?sslmode=require"
        );
        assert_eq!(url_with_user("postgres://h/db", "a", "b"), "postgres://a:b@h/db");
        assert_eq!(
            url_with_port("postgres://a:b@localhost:5/db?x=1", 7),
            "postgres://a:b@127.0.0.1:7/db?x=1"
        );
        assert_eq!(url_with_port("postgres://h", 7), "postgres://127.0.0.1:7");
        assert_eq!(port_of("postgres://a@h:6543/db"), 6543);
    }
}
