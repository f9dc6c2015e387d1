//! Pronto: a gateway that sends each LLM prompt to the backend that will produce its first
//! token soonest.
//!
//! Data flows one way: request bytes → [`request::RequestFeatures`] → [`routing`] decision →
//! proxy → observations fed back into the router's state.

#![warn(missing_docs)]

pub mod replay;
pub mod request;
pub mod routing;
pub mod sim;
pub mod tokens;
