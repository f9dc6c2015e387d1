//! Pronto: a gateway that sends each LLM prompt to the backend that will produce its first
//! token soonest.
//!
//! Data flows one way: request bytes → [`request::RequestFeatures`] → [`routing`] decision →
//! [`proxy`] → observations fed back into the backends' live state ([`backend`]).

#![warn(missing_docs)]

pub mod admin;
pub mod admission;
pub mod affinity;
pub mod auth;
pub mod backend;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod error;
pub mod gateway;
pub mod kv_events;
pub mod predict;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod replay;
pub mod request;
pub mod routing;
pub mod server;
pub mod sim;
pub mod sse;
pub mod telemetry;
pub mod tls;
pub mod tokens;
