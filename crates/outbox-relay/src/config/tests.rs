//! `config`'s unit tests.

use super::*;

#[test]
fn settings_never_print_their_secrets() {
    let (password, listen_password) = ("pa55w0rd-of-the-relay", "pa55w0rd-of-its-listener");
    let url = format!("postgres://outbox_relay:{password}@pgbouncer:6432/payments");
    let listen_url = format!("postgres://outbox_relay:{listen_password}@db:5432/payments");
    let cli = Cli::try_parse_from([
        "outbox-relay",
        "--database-url",
        &url,
        "--database-pool-mode",
        "transaction",
        "--relay-listen-database-url",
        &listen_url,
        "--fulfilment-url",
        "http://fulfilment/v1/",
        "--fulfilment-authorization",
        "Bearer t0ken-of-fulfilment",
        "--email-url",
        "http://ops:s3cret-in-the-url@email",
    ])
    .unwrap();
    for shown in [
        format!("{:?}", cli.settings),
        format!("{:#?}", cli.settings),
        format!("{cli:?}"),
    ] {
        assert!(!shown.contains(password), "the database password leaked: {shown}");
        assert!(
            !shown.contains(listen_password),
            "the LISTEN password leaked: {shown}"
        );
        for credential in ["s3cret-in-the-url", "t0ken-of-fulfilment"] {
            assert!(!shown.contains(credential), "{credential} leaked: {shown}");
        }
    }
    let relay = cli.settings.relay().unwrap();
    let shown = format!("{relay:?}");
    for credential in [
        "s3cret-in-the-url",
        "t0ken-of-fulfilment",
        "b3BzOnMzY3JldC1pbi10aGUtdXJs",
    ] {
        assert!(!shown.contains(credential), "{credential} leaked: {shown}");
    }
    // Sent verbatim; a URL's user and password become HTTP Basic and
    // leave the URL.
    assert_eq!(
        relay.fulfilment.authorization.as_ref().unwrap().expose(),
        "Bearer t0ken-of-fulfilment"
    );
    assert_eq!(relay.email.base_url.as_str(), "http://email/");
    assert_eq!(
        relay.email.authorization.as_ref().unwrap().expose(),
        "Basic b3BzOnMzY3JldC1pbi10aGUtdXJs"
    );
    // Still usable by the code that needs them.
    assert_eq!(
        cli.settings.database().unwrap().describe(),
        "pgbouncer:6432/payments"
    );
    let listen = cli.settings.listen_database().unwrap().unwrap();
    assert_eq!(listen.describe(), "db:5432/payments");
}

#[test]
fn downstream_credentials_are_checked_without_being_shown() {
    let relay = |url: &str, authorization: Option<&str>| {
        let mut args = vec!["outbox-relay", "--fulfilment-url", url, "--email-url", "http://e"];
        if let Some(a) = authorization {
            args.extend(["--fulfilment-authorization", a]);
        }
        Cli::try_parse_from(args).unwrap().settings.relay()
    };
    // Percent-encoded userinfo is decoded, as reqwest does: `a b:p@ss`.
    let ok = relay("https://a%20b:p%40ss@f.example:8443/api", None).unwrap();
    assert_eq!(ok.fulfilment.base_url.as_str(), "https://f.example:8443/api");
    assert_eq!(
        ok.fulfilment.authorization.unwrap().expose(),
        "Basic YSBiOnBAc3M="
    );
    assert!(
        relay("http://f", None)
            .unwrap()
            .fulfilment
            .authorization
            .is_none()
    );
    for (url, authorization, names) in [
        (
            "http://ops:s3cret@f",
            Some("Bearer s3cret-too"),
            "FULFILMENT_AUTHORIZATION",
        ),
        (
            "http://f",
            Some("Bearer s3cret\nX-Injected: 1"),
            "FULFILMENT_AUTHORIZATION",
        ),
        ("ftp://ops:s3cret@f", None, "FULFILMENT_URL"),
        ("http://ops:s3cret@f?x=1", None, "FULFILMENT_URL"),
    ] {
        let error = relay(url, authorization).unwrap_err();
        assert!(error.contains(names), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}
