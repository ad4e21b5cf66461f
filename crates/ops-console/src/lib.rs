//! ops-console: the operator's console in the browser. Server-rendered
//! pages, no script: search one event's story (by event id or prefix,
//! payment id or order id), triage the dead letters, settle the unmatched
//! payments, and the backlog at a glance. It runs the services' own
//! statements, guards included, so racing the CLI and the workers changes
//! nothing twice; it logs in with a role of its own (`ops_console`).
//!
//! # Layout
//! - [`config`]: environment variables and flags; off unless configured.
//! - [`server`]: [`server::Application`]: the listeners, the routes, the
//!   security headers every response carries.
//! - [`state`]: what every handler reaches.
//! - [`auth`]: the token sign-in, the sessions and their CSRF tokens.
//! - [`login`]: the sign-in and sign-out pages.
//! - [`pages`]: the pages (GET): backlog, story, dead letters, unmatched.
//! - [`actions`]: the actions (POST): requeue, discard, replay; each logged.
//! - [`metrics`]: `ops_console_actions_total`, by action and outcome.
//! - [`html`]: escaping, and the page every response is written into.
//! - [`storage`]: the console's own SQL (an order, the unmatched payments).
#![forbid(unsafe_code)]

pub mod actions;
pub mod auth;
pub mod config;
pub mod html;
pub mod login;
pub mod metrics;
pub mod pages;
pub mod server;
pub mod state;
pub mod storage;
