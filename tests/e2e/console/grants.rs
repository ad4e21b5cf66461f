//! The console's role, `ops_console` (migrations/V9), holds what its
//! statements need and nothing more: each grant it holds is needed by one of
//! the statements it runs (revoked, that statement no longer plans as the
//! role; tests/e2e/statements.rs plans every one of them with all the
//! grants), and what it must never do is refused.

use db::Sql;
use testkit::{Role, TestDb, assert_refused, grants_of};

use crate::statements::{pinned, plannable_as};

/// Every statement the console runs: its own, the services' it shares, and
/// the readiness check's.
fn runs() -> Vec<&'static Sql> {
    ops_console::storage::STATEMENTS
        .iter()
        .chain(webhook_ingest::storage::CONSOLE_STATEMENTS)
        .chain(outbox_relay::storage::CONSOLE_STATEMENTS)
        .chain(db::STATEMENTS)
        .copied()
        .collect()
}

#[tokio::test]
async fn the_console_role_holds_only_what_its_statements_need() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let console = pinned(TestDb::connect_url(&db.url_as(Role::Console)).await).await;
    for sql in [
        "DELETE FROM public.outbox",
        "DELETE FROM public.processed_events",
        "TRUNCATE public.outbox",
        "INSERT INTO public.orders (id, payment_id) VALUES (1, 'pay_1')",
        "INSERT INTO public.processed_events (event_id, event_type, status, result) VALUES ('e', 't', 'ignored', '{}')",
        "UPDATE public.outbox SET claims = 0",
        "UPDATE public.outbox SET payload = '{}'",
        "UPDATE public.processed_events SET deliveries = 2",
        "UPDATE public.orders SET payment_id = 'x'",
    ] {
        assert_refused(&console, sql).await;
    }

    let mut planned = Vec::new();
    for sql in runs() {
        if plannable_as(&console, sql).await.is_ok() {
            planned.push(sql);
        }
    }
    assert!(
        planned.len() >= 14,
        "the console's statements plan as its role: {}",
        planned.len()
    );
    let grants = grants_of(&owner, Role::Console.group()).await;
    assert!(grants.len() > 10, "{grants:?}");
    let mut unneeded = Vec::new();
    for grant in &grants {
        owner
            .batch_execute(&grant.revoke_sql(Role::Console.group()))
            .await
            .unwrap();
        let mut needed = false;
        for sql in &planned {
            if plannable_as(&console, sql).await.is_err() {
                needed = true;
                break;
            }
        }
        owner
            .batch_execute(&grant.grant_sql(Role::Console.group()))
            .await
            .unwrap();
        if !needed {
            unneeded.push(grant.to_string());
        }
    }
    assert!(
        unneeded.is_empty(),
        "ops_console holds grants none of its statements needs: {unneeded:#?}"
    );
}
