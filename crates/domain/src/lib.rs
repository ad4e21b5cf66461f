//! What the two services agree on, and nothing else: the provider's event,
//! the order state machine, the commands the ingest enqueues and the relay
//! delivers, their idempotency keys, and the versioned outbox payload.
//!
//! No I/O lives here, so every rule can be tested exhaustively in memory and
//! both services (deployed and upgraded independently) read the same rules.
//!
//! # Layout
//! - [`event`]: parsing a verified webhook body into a [`ProviderEvent`].
//! - [`order`]: order states and the [`transition`] table: what an event does
//!   to an order in each state.
//! - [`command`]: [`CommandKind`], [`Command`], idempotency keys, the outbox
//!   payload encoding, the outbox row's [`OutboxStatus`] and the downstream
//!   request each command becomes.
#![forbid(unsafe_code)]

pub mod command;
pub mod event;
pub mod order;

pub use command::{
    Command, CommandKind, Endpoint, OutboxPayload, OutboxStatus, PAYLOAD_VERSION, PayloadError,
};
pub use event::{EventError, EventKind, MAX_ID_LEN, ProviderEvent};
pub use order::{EventOutcome, OrderStatus, Transition, transition};
