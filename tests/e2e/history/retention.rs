//! Retention: the retained orders aged past it and pruned, then the
//! provider's resends and new refunds (phase 2).

use super::*;

impl Running<'_> {
    /// Retention, then phase 2: resends and new refunds of the retained
    /// orders. Returns the events whose records the prune removed.
    pub(super) async fn retention_then_phase2(
        &self,
        client: &tokio_postgres::Client,
        in_flight: usize,
        histories: &Histories,
        keys: &mut HashMap<String, KeyRecord>,
    ) -> HashSet<String> {
        // The downstream forgets its keys below, as a real email API does
        // after retention: what it held so far is kept here.
        merge(keys, &self.stack.downstream.stats());
        let pruned = self.age_and_prune(client, histories).await;
        // The orders come at last; the reconciler applies their events by itself.
        for order in histories.created_after_retention() {
            self.stack.shop.create(order).await;
        }
        let reset = self
            .stack
            .http
            .post(format!("{}/control/reset", self.stack.downstream.url()))
            .send()
            .await
            .unwrap();
        assert!(reset.status().is_success());

        let phase2 = &histories.phase2;
        let planned2 = planned_deliveries(phase2);
        self.watched.note(&format!(
            "phase 2: {} resends and new refunds of the {} retained orders, {} deliveries",
            thousands(phase2.iter().map(|g| g.events.len() as u64).sum()),
            thousands(phase2.len() as u64),
            thousands(planned2)
        ));
        self.watched
            .delivering(
                2,
                planned2,
                &self.log,
                deliver_all(self.stack, phase2, 2, in_flight, &self.log),
            )
            .await;
        // The reconciler looks at events older than 15 minutes once a minute.
        self.watched
            .until_drained(client, "phase 2", Duration::from_secs(180))
            .await;
        pruned
    }

    /// The retained orders' rows and events age eight days and are pruned.
    /// The events of the orders still to come age with them: the prune must
    /// keep them. Returns the events whose records it removed.
    pub(super) async fn age_and_prune(
        &self,
        client: &tokio_postgres::Client,
        histories: &Histories,
    ) -> HashSet<String> {
        let retained_ids: Vec<String> = histories
            .phase1
            .iter()
            .flat_map(|g| &g.events)
            .filter(|p| p.order.is_some_and(|o| histories.retained.contains(&o)))
            .map(|p| p.id.clone())
            .collect();
        let early_ids: Vec<String> = histories
            .phase1
            .iter()
            .filter(|g| matches!(g.create, Some((_, Late::AfterRetention))))
            .flat_map(|g| &g.events)
            .filter(|p| p.event_type != "payment.updated")
            .map(|p| p.id.clone())
            .collect();
        let retained_orders: Vec<i64> = histories.retained.iter().copied().collect();
        self.watched.note(&format!(
            "retention: {} orders' rows and {} events aged eight days, with {} unmatched events of {} orders still to come, then outbox-relay prune",
            thousands(retained_orders.len() as u64),
            thousands(retained_ids.len() as u64),
            thousands(early_ids.len() as u64),
            thousands(histories.created_after_retention().len() as u64)
        ));
        client
            .execute(
                "UPDATE outbox SET created_at = now() - interval '8 days', finished_at = now() - interval '8 days'
                  WHERE order_id = ANY($1)",
                &[&retained_orders],
            )
            .await
            .unwrap();
        let aged: Vec<String> = retained_ids.iter().chain(&early_ids).cloned().collect();
        client
            .execute(
                "UPDATE processed_events SET processed_at = now() - interval '8 days' WHERE event_id = ANY($1)",
                &[&aged],
            )
            .await
            .unwrap();
        let prune = std::process::Command::new(testkit::bin::path("outbox-relay"))
            .arg("prune")
            .env("DATABASE_URL", &self.stack.relay_url)
            .env("RETENTION_DAYS", "7")
            .env("FULFILMENT_URL", self.stack.downstream.url())
            .env("EMAIL_URL", self.stack.downstream.url())
            .output()
            .unwrap();
        assert!(prune.status.success(), "{prune:?}");
        assert_eq!(
            testkit::count(
                client,
                &format!(
                    "SELECT count(*) FROM outbox WHERE order_id IN ({})",
                    retained_orders
                        .iter()
                        .map(i64::to_string)
                        .chain(std::iter::once("0".into()))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            )
            .await,
            0,
            "the prune removed the retained orders' rows"
        );
        let kept: i64 = client
            .query_one(
                "SELECT count(*) FROM processed_events WHERE event_id = ANY($1) AND status = 'unmatched'",
                &[&early_ids],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            kept as usize,
            early_ids.len(),
            "the prune kept every unmatched event past retention"
        );
        retained_ids.into_iter().collect()
    }
}
