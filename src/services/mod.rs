//! The gateway's background loops, each over the state hub ([`crate::state`]): backend health
//! checks, engine `/metrics` scrapes, DNS discovery, model listing, config reload, KV-event
//! subscriptions, the replica-sync link, and the listener's TLS certificate resolver. The domain modules they drive ([`crate::backend`],
//! [`crate::cluster`], [`crate::kv_events`], [`crate::models`]) hold the pure logic and never
//! reach up into the state.

pub mod cluster;
pub mod discovery;
pub mod health;
pub mod kv_events;
pub mod models;
pub mod reload;
pub mod scrape;
pub mod tls;
