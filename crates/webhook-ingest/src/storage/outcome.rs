//! The `status` column of `processed_events`, as the statements read it.

use domain::EventOutcome;
use tokio_postgres::types::{FromSql, Type};

/// An event's `status` column, decoded: a name no [`EventOutcome`] has is an
/// error of the row, not a string for someone to parse later.
pub(super) struct StoredOutcome(pub(super) EventOutcome);

impl<'a> FromSql<'a> for StoredOutcome {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let name = <&str as FromSql>::from_sql(ty, raw)?;
        EventOutcome::parse(name)
            .map(Self)
            .ok_or_else(|| format!("unknown event status `{name}`").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}
