//! The two simulated APIs, what an effect is about, and a stored response.

use std::hash::Hash;

use actix_web::http::StatusCode;
use bytes::Bytes;
use serde::Deserialize;

use crate::downstream::stats::TargetEffects;

/// The two simulated APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Api {
    Shipments,
    Emails,
}

impl Api {
    pub(super) const ALL: [Api; 2] = [Api::Shipments, Api::Emails];

    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Shipments => "/shipments",
            Self::Emails => "/emails",
        }
    }

    /// The status of a request that created its effect: the fulfilment API
    /// made the shipment (201), the email API accepted the email for sending (202).
    pub(crate) fn success(self) -> StatusCode {
        match self {
            Self::Shipments => StatusCode::CREATED,
            Self::Emails => StatusCode::ACCEPTED,
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Template {
    OrderConfirmation,
    RefundNotice,
}

impl Template {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OrderConfirmation => "order_confirmation",
            Self::RefundNotice => "refund_notice",
        }
    }
}

/// What an effect is about: one shipment per order, one email per order and
/// template. More than one effect on a target is a double effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Shipment { order_id: i64 },
    Email { order_id: i64, template: Template },
}

impl Target {
    pub(super) fn api(self) -> Api {
        match self {
            Self::Shipment { .. } => Api::Shipments,
            Self::Email { .. } => Api::Emails,
        }
    }

    pub(super) fn effects(self, effects: u64) -> TargetEffects {
        let (order_id, template) = match self {
            Self::Shipment { order_id } => (order_id, None),
            Self::Email { order_id, template } => (order_id, Some(template.as_str().to_owned())),
        };
        TargetEffects {
            path: self.api().path().to_owned(),
            order_id,
            template,
            effects,
        }
    }
}

/// A response kept for replay: the status and the exact body bytes.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub status: StatusCode,
    pub body: Bytes,
}
