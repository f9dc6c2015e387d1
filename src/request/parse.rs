//! TEMPORARY parser (replaced by the req branch at merge).
#![allow(missing_docs)]
use super::{Endpoint, RequestFeatures};

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    #[error("missing field `{0}`")]
    MissingField(&'static str),
}

pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    session_header: Option<&str>,
) -> Result<RequestFeatures, RequestError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    let model = v["model"]
        .as_str()
        .ok_or(RequestError::MissingField("model"))?;
    let mut prompt = String::new();
    match endpoint {
        Endpoint::ChatCompletions => {
            let msgs = v["messages"]
                .as_array()
                .ok_or(RequestError::MissingField("messages"))?;
            for m in msgs {
                prompt.push_str(m["role"].as_str().unwrap_or(""));
                prompt.push_str(": ");
                prompt.push_str(m["content"].as_str().unwrap_or(""));
                prompt.push('\n');
            }
        }
        _ => prompt.push_str(v["prompt"].as_str().or(v["input"].as_str()).unwrap_or("")),
    }
    let mut f =
        RequestFeatures::synthetic(model, prompt, v["max_tokens"].as_u64().map(|x| x as u32));
    f.endpoint = endpoint;
    f.stream = v["stream"].as_bool().unwrap_or(false);
    f.session_key = session_header.map(String::from);
    Ok(f)
}
