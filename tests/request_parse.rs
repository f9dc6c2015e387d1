//! Request parsing through the public API: every content shape, field order, escapes, errors,
//! hostile inputs and a huge prompt.

use pronto_core::request::{
    parse_request, parse_request_with_prompt, Endpoint, RequestError, RequestFeatures,
};
use pronto_core::tokens::{self, BLOCK_TOKENS};

const CHAT: Endpoint = Endpoint::ChatCompletions;

fn chat(body: &str) -> Result<RequestFeatures, RequestError> {
    parse_request_with_prompt(CHAT, body.as_bytes(), None)
}

fn prompt(body: &str) -> String {
    chat(body).unwrap().prompt
}

// === chat: fields ===

#[test]
fn sdk_order_chat_body() {
    // The OpenAI Python SDK puts `messages` first and `model` after it.
    let body = r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],
        "model":"llama-3-8b","stream":true,"stream_options":{"include_usage":true},
        "max_completion_tokens":64,"max_tokens":999,"user":"u-1","temperature":0.2,
        "logit_bias":{"50256":-100},"n":1,"seed":null,"response_format":{"type":"text"}}"#;
    let f = chat(body).unwrap();
    assert_eq!(f.endpoint, CHAT);
    assert_eq!(f.model, "llama-3-8b");
    assert!(f.stream && f.include_usage);
    assert_eq!(f.max_tokens, Some(64), "max_completion_tokens wins");
    assert_eq!(f.session_key.as_deref(), Some("u-1"));
    assert_eq!(f.prompt, "system: Be brief.\nuser: Hi\n");
    let (n, hashes) = tokens::text_block_hashes(f.prompt.as_bytes(), BLOCK_TOKENS);
    assert_eq!(f.prompt_tokens as usize, n);
    assert_eq!(f.block_hashes, hashes);
}

#[test]
fn defaults_and_nulls_for_optional_fields() {
    let f = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert!(!f.stream && !f.include_usage);
    assert_eq!((f.max_tokens, f.session_key), (None, None));
    let f = chat(
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":null,
        "stream_options":null,"max_tokens":null,"max_completion_tokens":null,"user":null,"tools":null}"#,
    )
    .unwrap();
    assert!(!f.stream && !f.include_usage);
    assert_eq!((f.max_tokens, f.session_key), (None, None));
    let f = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":7,"stream_options":{}}"#)
        .unwrap();
    assert_eq!(f.max_tokens, Some(7));
    assert!(!f.include_usage);
}

#[test]
fn reasoning_effort_is_read_on_chat_and_unknown_levels_pass_as_not_given() {
    use pronto_core::predict::ReasoningEffort;
    let msgs = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
    for (value, want) in [
        (r#""high""#, Some(ReasoningEffort::High)),
        (r#""low""#, Some(ReasoningEffort::Low)),
        (r#""minimal""#, Some(ReasoningEffort::Minimal)),
        (r#""\u006eone""#, Some(ReasoningEffort::None)),
        (r#""xhigh""#, None),
        ("null", None),
    ] {
        let f = chat(&format!(r#"{{{msgs},"reasoning_effort":{value}}}"#)).unwrap();
        assert_eq!(f.reasoning_effort, want, "{value}");
    }
    assert_eq!(chat(&format!("{{{msgs}}}")).unwrap().reasoning_effort, None);
    // Not a completions field: skipped there whatever its type.
    let f = parse_request(
        Endpoint::Completions,
        br#"{"model":"m","prompt":"x","reasoning_effort":3}"#,
        None,
    )
    .unwrap();
    assert_eq!(f.reasoning_effort, None);
}

#[test]
fn session_header_wins_over_user() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"user":"alice"}"#;
    let f = parse_request(CHAT, body, Some("sess-9")).unwrap();
    assert_eq!(f.session_key.as_deref(), Some("sess-9"));
    let f = parse_request(CHAT, body, Some("")).unwrap();
    assert_eq!(f.session_key.as_deref(), Some("alice"));
    let body = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"user":""}"#;
    assert_eq!(parse_request(CHAT, body, None).unwrap().session_key, None);
}

// === chat: content shapes and the canonical prompt ===

#[test]
fn string_null_and_missing_content() {
    assert_eq!(
        prompt(
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null},
            {"role":"assistant"}]}"#
        ),
        "user: a\nassistant: \nassistant: \n"
    );
}

#[test]
fn multipart_content_keeps_only_text_parts() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"Describe "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},
        {"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},
        {"text":" the picture","type":"text"},
        {"type":"text"},
        {"type":"refusal","refusal":"no"}]}]}"#;
    assert_eq!(prompt(body), "user: Describe  the picture\n");
    let empty = r#"{"model":"m","messages":[{"role":"user","content":[]}]}"#;
    assert_eq!(prompt(empty), "user: \n");
}

#[test]
fn tool_calls_and_tools_extend_the_prompt() {
    let body = r#"{"messages":[
        {"role":"user","content":"Weather in Paris?"},
        {"content":null,"role":"assistant","tool_calls":[
            {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
            {"id":"c2","type":"function","function":{"name":"get_time","arguments":{"tz":"CET"}}}]},
        {"role":"tool","tool_call_id":"c1","content":"18C"},
        {"role":"assistant","content":"Old style: ","function_call":{"name":"f","arguments":"{}"}}],
        "model":"m",
        "tools": [ {"type":"function","function":{"name":"get_weather"}} ]}"#;
    assert_eq!(
        prompt(body),
        "tools: [ {\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}} ]\n\
         user: Weather in Paris?\n\
         assistant: get_weather{\"city\":\"Paris\"}get_time{\"tz\":\"CET\"}\n\
         tool: 18C\n\
         assistant: Old style: f{}\n"
    );
    let no_tools = r#"{"model":"m","tools":[],"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(prompt(no_tools), "user: x\n");
}

#[test]
fn escapes_are_decoded() {
    let body = r#"{"model":"m","messages":[{"role":"user",
        "content":"line1\nline2\t\"q\" \\ \/ caf\u00e9 \ud83d\ude00 中文"}]}"#;
    assert_eq!(
        prompt(body),
        "user: line1\nline2\t\"q\" \\ / café 😀 中文\n"
    );
    let escaped_model = r#"{"model":"a\/b","messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(chat(escaped_model).unwrap().model, "a/b");
}

#[test]
fn next_turn_extends_the_previous_turns_blocks() {
    let system = "You are a careful assistant who answers questions about GPUs. ".repeat(30);
    let turn1 = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is a KV cache?"},
    ]});
    let mut turn2 = turn1.clone();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(serde_json::json!({"role": "assistant", "content": "It stores keys and values."}));
    msgs.push(serde_json::json!({"role": "user", "content": "And paged attention?"}));
    let a = chat(&turn1.to_string()).unwrap();
    let b = chat(&turn2.to_string()).unwrap();
    assert!(b.prompt.starts_with(&a.prompt));
    assert!(a.block_hashes.len() > 20);
    assert_eq!(b.block_hashes[..a.block_hashes.len()], a.block_hashes[..]);
    assert!(b.block_hashes.len() > a.block_hashes.len());
}

#[test]
fn huge_prompt() {
    let system = "Answer with care, citing the documents below.\n".repeat(2000);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for i in 0..200 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let text = format!("Turn {i}: \"quoted\" text about topic {i}. ").repeat(40);
        messages.push(serde_json::json!({"role": role, "content": text}));
    }
    let body =
        serde_json::json!({"messages": messages, "model": "big", "stream": true}).to_string();
    assert!(body.len() > 400 * 1024, "{}", body.len());
    let f = chat(&body).unwrap();
    assert!(f.prompt.len() > 390 * 1024);
    assert!(f.prompt.starts_with("system: Answer with care"));
    assert_eq!(f.prompt.matches('\n').count(), 2000 + 201);
    let (n, hashes) = tokens::text_block_hashes(f.prompt.as_bytes(), BLOCK_TOKENS);
    assert_eq!((f.prompt_tokens as usize, &f.block_hashes), (n, &hashes));
    assert_eq!(f.block_hashes.len(), n / BLOCK_TOKENS);
}

// === chat: errors ===

fn wrong(field: &'static str) -> impl Fn(&RequestError) -> bool {
    move |e| matches!(e, RequestError::WrongType { field: f, .. } if *f == field)
}

#[test]
fn missing_and_empty_fields() {
    let no_model = r#"{"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(chat(no_model), Err(RequestError::MissingField("model")));
    assert_eq!(
        chat(r#"{"model":"m"}"#),
        Err(RequestError::MissingField("messages"))
    );
    let e = chat(r#"{"model":"m","messages":[]}"#).unwrap_err();
    assert!(wrong("messages")(&e), "{e:?}");
    assert_eq!(
        e.to_string(),
        "field `messages` must be a non-empty array of message objects"
    );
    assert_eq!(chat("{}"), Err(RequestError::MissingField("model")));
}

#[test]
fn wrong_typed_fields() {
    let msgs = r#""messages":[{"role":"user","content":"x"}]"#;
    for (extra, field) in [
        (r#""model":5"#, "model"),
        (r#""model":null"#, "model"),
        (r#""model":"m","stream":"yes""#, "stream"),
        (r#""model":"m","max_tokens":-1"#, "max_tokens"),
        (r#""model":"m","max_tokens":1.5"#, "max_tokens"),
        (
            r#""model":"m","max_completion_tokens":4294967296"#,
            "max_completion_tokens",
        ),
        (r#""model":"m","stream_options":true"#, "stream_options"),
        (
            r#""model":"m","stream_options":{"include_usage":"y"}"#,
            "stream_options",
        ),
        (r#""model":"m","user":["u"]"#, "user"),
        (r#""model":"m","reasoning_effort":3"#, "reasoning_effort"),
        (r#""model":"m","tools":{"type":"function"}"#, "tools"),
    ] {
        let e = chat(&format!("{{{msgs},{extra}}}")).unwrap_err();
        assert!(wrong(field)(&e), "{extra}: {e:?}");
        assert_eq!(e.param(), Some(field));
    }
    for bad in [
        r#""messages":{"role":"user"}"#,
        r#""messages":"hi""#,
        r#""messages":null"#,
    ] {
        let e = chat(&format!(r#"{{"model":"m",{bad}}}"#)).unwrap_err();
        assert!(wrong("messages")(&e), "{bad}: {e:?}");
    }
}

#[test]
fn malformed_messages_name_their_index() {
    for (msg, needle) in [
        (r#"{"content":"x"}"#, "missing field `role`"),
        (r#"{"role":1,"content":"x"}"#, "expected a string"),
        (r#""just text""#, "expected a message object"),
        (
            r#"{"role":"user","content":5}"#,
            "`content` must be a string, null, or an array",
        ),
        (r#"{"role":"user","content":{"text":"x"}}"#, "not map"),
        (
            r#"{"role":"user","content":["x"]}"#,
            "expected a content part object",
        ),
        (
            r#"{"role":"user","content":[{"type":"text","text":3}]}"#,
            "expected a string",
        ),
        (
            r#"{"role":"assistant","tool_calls":{"id":1}}"#,
            "invalid type: map",
        ),
    ] {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"ok"}},{msg}]}}"#);
        match chat(&body) {
            Err(RequestError::InvalidMessage { index: 1, msg }) => {
                assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
                assert!(!msg.contains(" at line "), "{msg}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn invalid_json_reports_position() {
    let e = chat("{\"model\":\"m\",\n\"messages\":[,]}").unwrap_err();
    match e {
        RequestError::InvalidJson {
            line,
            column,
            ref msg,
        } => {
            assert_eq!((line, column), (2, 13));
            assert_eq!(msg, "expected value");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "request body is not valid JSON: expected value (line 2, column 13)"
    );
    for bad in [
        "",
        "   ",
        r#"{"model":"m""#,
        r#"{"model":"m",}"#,
        r#"{"model":"m"} x"#,
        r#"{"model":"unterminated}"#,
        r#"{"model":"bad \q escape"}"#,
    ] {
        assert!(
            matches!(chat(bad), Err(RequestError::InvalidJson { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn non_objects_and_non_utf8() {
    for body in ["[]", "\"text\"", "42", "null", "true"] {
        assert_eq!(chat(body), Err(RequestError::NotAnObject), "{body}");
    }
    let mut body = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
    let offset = body.len();
    body.extend_from_slice(b"\xe9\"}]}");
    let e = parse_request(CHAT, &body, None).unwrap_err();
    assert_eq!(e, RequestError::NotUtf8 { offset });
    assert!(e.to_string().contains("not valid UTF-8"));
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let d = deep(100_000);
    let cases = [
        d.clone(),
        format!(r#"{{"model":"m","messages":{d}}}"#),
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":{d}}}]}}"#),
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":{d}}}]}}]}}"#),
        format!(r#"{{"model":"m","stream_options":{{"x":{d}}},"messages":[]}}"#),
        // Unterminated nesting.
        format!(r#"{{"model":"m","x":{}"#, "[".repeat(100_000)),
    ];
    for body in &cases {
        assert!(chat(body).is_err());
    }
    // Well-formed deep nesting in a skipped field is skipped (iteratively), not an error.
    let ok =
        format!(r#"{{"model":"m","metadata":{d},"messages":[{{"role":"user","content":"x"}}]}}"#);
    assert_eq!(chat(&ok).unwrap().prompt, "user: x\n");
    // Where the parser recurses, the limit is serde_json's.
    let content = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"a"}},{}]}}]}}"#,
        deep(200)
    );
    assert!(matches!(
        chat(&content),
        Err(RequestError::InvalidMessage { index: 0, .. })
    ));
}

// === completions and embeddings ===

#[test]
fn completions_prompt_shapes() {
    let p = |body: &str| parse_request_with_prompt(Endpoint::Completions, body.as_bytes(), None);
    let f = p(
        r#"{"prompt":"Once upon\na time","model":"m","stream":true,"max_tokens":16,
        "stream_options":{"include_usage":true},"max_completion_tokens":1,"messages":"ignored"}"#,
    )
    .unwrap();
    assert_eq!(f.endpoint, Endpoint::Completions);
    assert_eq!(f.prompt, "Once upon\na time");
    assert_eq!(f.max_tokens, Some(16), "max_completion_tokens is chat-only");
    assert!(f.stream && f.include_usage);

    let f = p(r#"{"model":"m","prompt":["a","b \"c\"", ""]}"#).unwrap();
    assert_eq!(f.prompt, "a\nb \"c\"\n");

    let ids: Vec<u32> = (0..40).collect();
    let f = p(&format!(r#"{{"model":"m","prompt":{ids:?}}}"#)).unwrap();
    assert_eq!((f.prompt.as_str(), f.prompt_tokens), ("", 40));
    assert_eq!(f.block_hashes, tokens::block_hashes(&ids, BLOCK_TOKENS));
    assert_eq!(f.block_hashes.len(), 2);

    let f = p(r#"{"model":"m","prompt":[[1,2,3],[4,5]]}"#).unwrap();
    assert_eq!((f.prompt.as_str(), f.prompt_tokens), ("", 5));

    let f = p(r#"{"model":"m","prompt":[ ]}"#).unwrap();
    assert_eq!((f.prompt.as_str(), f.prompt_tokens), ("", 0));

    assert_eq!(
        p(r#"{"model":"m"}"#),
        Err(RequestError::MissingField("prompt"))
    );
    for bad in [
        r#"5"#,
        "null",
        r#"{"a":1}"#,
        r#"["a",1]"#,
        r#"[1,"a"]"#,
        r#"[-1]"#,
        r#"[[1],["a"]]"#,
    ] {
        let e = p(&format!(r#"{{"model":"m","prompt":{bad}}}"#)).unwrap_err();
        assert!(wrong("prompt")(&e), "{bad}: {e:?}");
    }
}

#[test]
fn embeddings_input_shapes() {
    let p = |body: &str| parse_request_with_prompt(Endpoint::Embeddings, body.as_bytes(), None);
    let f = p(r#"{"input":"hello","model":"e5","stream":true,"max_tokens":3,"user":"u"}"#).unwrap();
    assert_eq!(f.endpoint, Endpoint::Embeddings);
    assert_eq!((f.prompt.as_str(), f.model.as_str()), ("hello", "e5"));
    assert!(!f.stream, "stream is not an embeddings field");
    assert_eq!(f.max_tokens, None);
    assert_eq!(f.session_key.as_deref(), Some("u"));
    assert_eq!(
        p(r#"{"model":"e","input":["x","y"]}"#).unwrap().prompt,
        "x\ny"
    );
    assert_eq!(
        p(r#"{"model":"e","input":[7,8,9]}"#).unwrap().prompt_tokens,
        3
    );
    assert_eq!(
        p(r#"{"model":"e","prompt":"x"}"#),
        Err(RequestError::MissingField("input"))
    );
    assert!(wrong("input")(
        &p(r#"{"model":"e","input":true}"#).unwrap_err()
    ));
}

#[test]
fn the_gateways_parse_keeps_no_copy_of_the_prompt_and_hashes_the_same() {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "lorem ipsum ".repeat(5_000)
    );
    let lean = parse_request(CHAT, body.as_bytes(), None).unwrap();
    let full = parse_request_with_prompt(CHAT, body.as_bytes(), None).unwrap();
    assert!(lean.prompt.is_empty() && full.prompt.len() > 50_000);
    assert_eq!(
        (lean.prompt_tokens, &lean.block_hashes),
        (full.prompt_tokens, &full.block_hashes)
    );
}
