//! The names `tests/e2e/per_order.rs` still uses, kept only until it moves
//! to [`record_verdicts`], [`RowVerdict`] and [`Verdict`]; delete this file
//! (and its `mod` line) then. Nothing in the relay uses them.

use super::{Recorded, RowKind, RowVerdict, Verdict, record_verdicts};

#[doc(hidden)]
pub type Completion = Verdict;

#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: i64,
    pub claim: i32,
    pub completion: Verdict,
}

#[doc(hidden)]
pub async fn record_outcomes(
    client: &db::Client,
    owner: &str,
    outcomes: &[Outcome],
) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    let verdicts: Vec<RowVerdict> = outcomes
        .iter()
        .map(|o| RowVerdict {
            id: o.id,
            claim: o.claim,
            verdict: o.completion.clone(),
        })
        .collect();
    record_verdicts(client, owner, &verdicts).await
}

impl PartialEq<&str> for RowKind {
    fn eq(&self, text: &&str) -> bool {
        self.as_str() == *text
    }
}
