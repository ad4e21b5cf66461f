//! TLS to the database, as against a managed Postgres: a private cluster
//! serving a certificate for `localhost` signed by a CA of the test's own
//! (made with openssl). Both services serve a webhook end to end with
//! `sslmode=require` and with `sslmode=verify-full&sslrootcert=<CA>`, over
//! encrypted connections only; `verify-full` refuses a server whose
//! certificate another CA signed, and a host name the certificate does not
//! name, while `verify-ca` (the chain alone) accepts the latter.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::{Proc, SECRET, TempDir, event, post_signed, wait_ready};
use simulator::downstream::DownstreamConfig;
use testkit::{PrivateCluster, Role};

use crate::harness;

#[tokio::test]
async fn both_services_work_over_tls_and_verify_full_checks_the_ca_and_the_host_name() {
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-tls-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let pki = Pki::create(&dir.0);
    let cluster = PrivateCluster::start_with_tls(&pki.server_cert, &pki.server_key).expect("a TLS cluster");
    let admin_url = cluster.migrated_database("shop").await.unwrap();
    let admin = testkit::TestDb::connect_url(&admin_url).await;
    let ingest_url = testkit::login_url(&admin_url, Role::Ingest).await;
    let relay_url = testkit::login_url(&admin_url, Role::Relay).await;
    let ca = pki.ca.display().to_string();
    let other_ca = pki.other_ca.display().to_string();
    // The certificate names `localhost`, not 127.0.0.1.
    let by_name = |url: &str| url.replace("@127.0.0.1:", "@localhost:");

    // What verify-full refuses, and what the weaker modes accept.
    let verify_full = |url: &str, ca: &str| format!("{}?sslmode=verify-full&sslrootcert={ca}", by_name(url));
    let (ok, err) = events_list(&verify_full(&ingest_url, &other_ca));
    assert!(!ok && err.contains("UnknownIssuer"), "another CA: {err}");
    let (ok, err) = events_list(&format!("{ingest_url}?sslmode=verify-full&sslrootcert={ca}"));
    assert!(
        !ok && err.contains("not valid for name"),
        "a name the certificate lacks: {err}"
    );
    let (ok, err) = events_list(&format!("{ingest_url}?sslmode=verify-ca&sslrootcert={ca}"));
    assert!(ok, "verify-ca checks the chain only: {err}");
    let (ok, err) = events_list(&verify_full(&ingest_url, &ca));
    assert!(ok, "verify-full: {err}");

    let downstream = simulator::downstream::spawn(DownstreamConfig::default())
        .await
        .unwrap();
    let http = testkit::http();
    for (n, (ingest, relay)) in [
        (
            format!("{ingest_url}?sslmode=require"),
            format!("{relay_url}?sslmode=require"),
        ),
        (verify_full(&ingest_url, &ca), verify_full(&relay_url, &ca)),
    ]
    .into_iter()
    .enumerate()
    {
        let order = n as i64 + 1;
        admin
            .execute(
                "INSERT INTO orders (id, payment_id) VALUES ($1, 'pay_' || $1::int8)",
                &[&order],
            )
            .await
            .unwrap();
        let (port, ingest_admin, relay_admin) =
            (testkit::free_port(), testkit::free_port(), testkit::free_port());
        let mut ingest = Proc::spawn(
            "webhook-ingest",
            &[
                ("DATABASE_URL".into(), ingest),
                ("WEBHOOK_SECRETS".into(), SECRET.into()),
                ("INGEST_LISTEN_ADDR".into(), format!("127.0.0.1:{port}")),
                ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{ingest_admin}")),
                ("RUST_LOG".into(), "warn".into()),
            ],
            &dir.0,
        );
        let mut relay = Proc::spawn(
            "outbox-relay",
            &[
                ("DATABASE_URL".into(), relay),
                ("FULFILMENT_URL".into(), downstream.url()),
                ("EMAIL_URL".into(), downstream.url()),
                ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{relay_admin}")),
                ("RUST_LOG".into(), "warn".into()),
            ],
            &dir.0,
        );
        wait_ready(&http, &format!("http://127.0.0.1:{ingest_admin}")).await;
        wait_ready(&http, &format!("http://127.0.0.1:{relay_admin}")).await;

        let body = event(
            &format!("evt_{order}"),
            "payment.succeeded",
            &format!("pay_{order}"),
        );
        let r = post_signed(&http, &format!("http://127.0.0.1:{port}"), &body, SECRET, &[]).await;
        assert_eq!(r.status(), 200, "mode {n}");
        wait_until_done(&admin, order).await;

        // Every connection the services hold is encrypted (the pool, the
        // relay's LISTEN): none fell back to plain text.
        let row = admin
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                   FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                  WHERE a.usename IN ('webhook_test_ingest', 'webhook_test_relay')",
                &[],
            )
            .await
            .unwrap();
        let (encrypted, plain): (i64, i64) = (row.get(0), row.get(1));
        assert!(encrypted >= 2, "mode {n}: {encrypted} encrypted connections");
        assert_eq!(plain, 0, "mode {n}: {plain} unencrypted connections");

        ingest.stop(Duration::from_secs(10));
        relay.stop(Duration::from_secs(15));
    }
    let stats = downstream.stats();
    assert_eq!((stats.effects, stats.double_effects), (4, 0), "{stats:?}");
}

async fn wait_until_done(admin: &tokio_postgres::Client, order: i64) {
    for _ in 0..200 {
        let done: i64 = admin
            .query_one(
                "SELECT count(*) FROM outbox WHERE order_id = $1 AND status = 'done'",
                &[&order],
            )
            .await
            .unwrap()
            .get(0);
        if done == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("order {order}: its shipment and confirmation were not delivered");
}

/// `webhook-ingest events list` against `url`: (success, stderr).
fn events_list(url: &str) -> (bool, String) {
    let out = Command::new(testkit::bin::path("webhook-ingest"))
        .args(["events", "list", "--json"])
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A CA, a server certificate it signed for `localhost` (DNS name only), and
/// an unrelated CA.
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

impl Pki {
    fn create(dir: &Path) -> Self {
        for name in ["ca", "other-ca"] {
            let (key, cert, subject) = (
                format!("{name}.key"),
                format!("{name}.pem"),
                format!("/CN=webhook test {name}"),
            );
            #[rustfmt::skip]
            openssl(dir, &[
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", &key, "-out", &cert, "-days", "2", "-subj", &subject,
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
            ]);
        }
        #[rustfmt::skip]
        openssl(dir, &[
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n",
        )
        .unwrap();
        #[rustfmt::skip]
        openssl(dir, &[
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt",
        ]);
        Self {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
