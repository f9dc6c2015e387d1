use super::*;
use serde_json::json;

fn chunk(id: &str, created: u64, delta: Value, finish: Value) -> String {
    let v = json!({"id": id, "object": "chat.completion.chunk", "created": created,
                   "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

fn events(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn first_upstream_passes_through_whole_events_byte_for_byte() {
    let stream = [
        chunk(
            "a",
            1,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        ),
        chunk("a", 1, json!({"content": " hello"}), Value::Null),
        chunk("a", 1, json!({"content": " world"}), Value::Null),
    ]
    .concat();
    // Any chunking gives the same bytes, and only whole events.
    for cut in 1..stream.len() {
        let mut s = Splicer::new(Api::Chat);
        let (a, b) = stream.as_bytes().split_at(cut);
        let mut out = s.feed(a).out;
        assert!(out.is_empty() || out.ends_with(b"\n\n"), "cut {cut}");
        out.extend(s.feed(b).out);
        assert_eq!(out, stream.as_bytes(), "cut {cut}");
        assert_eq!(s.text(), " hello world");
        assert_eq!(s.output_events(), 2);
        assert!(s.refusal().is_none() && !s.finished() && !s.done());
    }
}

#[test]
fn a_half_event_is_held_and_dropped_when_the_upstream_fails() {
    let mut s = Splicer::new(Api::Chat);
    let whole = chunk("a", 1, json!({"content": " one"}), Value::Null);
    let half = &chunk("a", 1, json!({"content": " two"}), Value::Null)[..20];
    let out = s.feed(format!("{whole}{half}").as_bytes()).out;
    assert_eq!(out, whole.as_bytes());
    s.begin_continuation(1);
    let out = s.feed(chunk("b", 9, json!({"content": " two"}), Value::Null).as_bytes());
    let ev = events(&out.out);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0]["id"].as_str(), ev[0]["created"].as_u64()),
        (Some("a"), Some(1))
    );
    assert_eq!(s.text(), " one two");
}

#[test]
fn the_continuation_loses_its_role_chunk_and_sums_usage() {
    let mut s = Splicer::new(Api::Chat);
    s.feed(
        chunk(
            "a",
            1,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )
        .as_bytes(),
    );
    for w in [" x", " y", " z"] {
        s.feed(chunk("a", 1, json!({"content": w}), Value::Null).as_bytes());
    }
    s.begin_continuation(3);
    let usage = json!({"id": "b", "object": "chat.completion.chunk", "created": 5, "model": "m",
        "choices": [], "usage": {"prompt_tokens": 13, "completion_tokens": 2, "total_tokens": 15,
                                 "prompt_tokens_details": {"cached_tokens": 12}}});
    let cont = [
        chunk(
            "b",
            5,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        ),
        chunk(
            "b",
            5,
            json!({"role": "assistant", "content": " w"}),
            Value::Null,
        ),
        chunk("b", 5, json!({"content": " v"}), json!("length")),
        format!("data: {usage}\n\ndata: [DONE]\n\n"),
    ]
    .concat();
    let fed = s.feed(cont.as_bytes());
    let ev = events(&fed.out);
    assert_eq!(ev.len(), 3, "the role-only chunk is dropped");
    assert!(ev[0]["choices"][0]["delta"].get("role").is_none());
    assert_eq!(ev[0]["choices"][0]["delta"]["content"], " w");
    assert!(ev.iter().all(|e| e["id"] == "a" && e["created"] == 1));
    let u = &ev[2]["usage"];
    assert_eq!(
        (
            u["prompt_tokens"].as_u64(),
            u["completion_tokens"].as_u64(),
            u["total_tokens"].as_u64()
        ),
        (Some(10), Some(5), Some(15))
    );
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 10);
    assert!(s.done() && s.finished());
    assert_eq!(s.text(), " x y z w v");
    assert!(String::from_utf8_lossy(&fed.out).ends_with("data: [DONE]\n\n"));
}

#[test]
fn error_events_are_withheld_and_tool_calls_and_reasoning_refuse() {
    let mut s = Splicer::new(Api::Chat);
    let fed = s.feed(b"event: error\ndata: {\"error\":{\"message\":\"boom\"}}\n\n");
    assert_eq!(fed.error.as_deref(), Some("boom"));
    assert!(fed.out.is_empty());
    let fed = s.feed(b"data: {\"object\":\"error\",\"message\":\"vllm\"}\n\n");
    assert_eq!(fed.error.as_deref(), Some("vllm"));

    let mut s = Splicer::new(Api::Chat);
    s.feed(chunk("a", 1, json!({"tool_calls": [{"index": 0}]}), Value::Null).as_bytes());
    assert_eq!(s.refusal(), Some(NotContinuable::ToolCall));
    let mut s = Splicer::new(Api::Chat);
    s.feed(chunk("a", 1, json!({"reasoning_content": "hmm"}), Value::Null).as_bytes());
    assert_eq!(s.refusal(), Some(NotContinuable::Reasoning));
    // Comments pass; a last event without its blank line goes out at the end.
    let mut s = Splicer::new(Api::Completions);
    assert_eq!(s.feed(b": keep-alive\n\n").out, b": keep-alive\n\n");
    assert!(s
        .feed(b"data: {\"choices\":[{\"text\":\" t\"}]}")
        .out
        .is_empty());
    assert_eq!(s.finish(), b"data: {\"choices\":[{\"text\":\" t\"}]}");
    assert_eq!(s.text(), " t");
}

#[test]
fn chat_continuation_appends_the_partial_answer() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":10,
        "max_completion_tokens":8,"stream":true}"#;
    let out = continuation_body(Api::Chat, body, " so far", 3).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["messages"][1],
        json!({"role": "assistant", "content": " so far"})
    );
    assert_eq!(v["continue_final_message"], true);
    assert_eq!(v["add_generation_prompt"], false);
    assert_eq!(
        (
            v["max_tokens"].as_u64(),
            v["max_completion_tokens"].as_u64()
        ),
        (Some(7), Some(5))
    );
    assert_eq!(v["stream"], true);
    // A second continuation extends the same final message.
    let again = continuation_body(Api::Chat, &out, " more", 2).unwrap();
    let v: Value = serde_json::from_slice(&again).unwrap();
    assert_eq!(v["messages"].as_array().unwrap().len(), 2);
    assert_eq!(v["messages"][1]["content"], " so far more");
}

#[test]
fn completions_continuation_extends_the_prompt() {
    let out = continuation_body(
        Api::Completions,
        br#"{"prompt":"abc","max_tokens":4}"#,
        " d",
        1,
    )
    .unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        (v["prompt"].as_str(), v["max_tokens"].as_u64()),
        (Some("abc d"), Some(3))
    );
    let one = continuation_body(Api::Completions, br#"{"prompt":["abc"]}"#, " d", 1).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&one).unwrap()["prompt"],
        "abc d"
    );
    // No text yet: the request as it was.
    let same = continuation_body(Api::Completions, br#"{"prompt":"abc"}"#, "", 0).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&same).unwrap()["prompt"],
        "abc"
    );
}

#[test]
fn dishonest_continuations_are_refused() {
    let chat = |extra: &str| {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"q"}}]{extra}}}"#);
        continuation_body(Api::Chat, body.as_bytes(), " t", 1)
    };
    assert_eq!(chat(r#","n":2"#), Err(NotContinuable::SeveralChoices));
    assert_eq!(chat(r#","logprobs":true"#), Err(NotContinuable::Logprobs));
    assert_eq!(chat(r#","top_logprobs":2"#), Err(NotContinuable::Logprobs));
    assert_eq!(chat(r#","max_tokens":1"#), Err(NotContinuable::NoBudget));
    assert!(chat(r#","n":1,"logprobs":false"#).is_ok());
    let comp = |body: &str| continuation_body(Api::Completions, body.as_bytes(), " t", 1);
    assert_eq!(
        comp(r#"{"prompt":"a","echo":true}"#),
        Err(NotContinuable::Prompt)
    );
    assert_eq!(comp(r#"{"prompt":["a","b"]}"#), Err(NotContinuable::Prompt));
    assert_eq!(comp(r#"{"prompt":[1,2,3]}"#), Err(NotContinuable::Prompt));
    assert_eq!(
        comp(r#"{"prompt":"a","best_of":3}"#),
        Err(NotContinuable::SeveralChoices)
    );
    assert_eq!(
        comp(r#"{"prompt":"a","logprobs":0}"#),
        Err(NotContinuable::Logprobs)
    );
    assert_eq!(comp("[1]"), Err(NotContinuable::Body));
}
