//! The outbox's `kind` and `status` columns, decoded into enums as a row is
//! read (`row.get::<_, RowKind>("kind")`), so that nothing past the storage
//! compares their text.

use std::error::Error;
use std::fmt;

use domain::{CommandKind, OutboxStatus};
use tokio_postgres::types::{FromSql, Type};

/// A row's `kind`. The column is free text: a newer ingest (or an operator)
/// may write a kind this release does not know. Such a row is kept as it
/// reads, to be shown in logs and recorded dead at its first attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowKind {
    Known(CommandKind),
    Unknown(String),
}

impl RowKind {
    pub fn parse(text: &str) -> Self {
        CommandKind::parse(text).map_or_else(|| Self::Unknown(text.to_owned()), Self::Known)
    }

    /// The kind as the row has it, for logs and spans.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Known(kind) => kind.as_str(),
            Self::Unknown(text) => text,
        }
    }

    /// The `kind` metric label: one of the known kinds, or `unknown`, so
    /// that whatever a row says cannot add a series.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Known(kind) => kind.as_str(),
            Self::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for RowKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'a> FromSql<'a> for RowKind {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        <&str as FromSql>::from_sql(ty, raw).map(Self::parse)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// A row's `status` as read: [`OutboxStatus`], or an error naming a status
/// the schema does not allow (`row.get::<_, Status>("status").0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub OutboxStatus);

impl<'a> FromSql<'a> for Status {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        OutboxStatus::parse(text)
            .map(Self)
            .ok_or_else(|| format!("outbox status `{text}` is none the schema allows").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_statuses_read_as_the_schema_writes_them() {
        for kind in CommandKind::ALL {
            assert_eq!(RowKind::parse(kind.as_str()), RowKind::Known(kind));
            assert_eq!(RowKind::Known(kind).label(), kind.as_str());
        }
        let unknown = RowKind::parse("teleport");
        assert_eq!((unknown.as_str(), unknown.label()), ("teleport", "unknown"));
        for status in OutboxStatus::ALL {
            assert_eq!(OutboxStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(OutboxStatus::parse("Done"), None);
    }
}
