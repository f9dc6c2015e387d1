//! Tests of the SSE scanner (a child module of `sse`).

use proptest::prelude::*;

use super::*;

fn chat_chunk(delta: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]}}"#
    )
}

fn event(data: &str) -> String {
    format!("data: {data}\n\n")
}

/// A vLLM-like stream: role-only chunk, three content chunks, a finish chunk, usage, [DONE].
fn vllm_stream() -> String {
    let mut s = String::new();
    s += &event(&chat_chunk(r#"{"role":"assistant","content":""}"#));
    for word in ["Hello", " wor", "ld"] {
        s += &event(&chat_chunk(&format!(r#"{{"content":"{word}"}}"#)));
    }
    s += &event(
        &chat_chunk(r#"{"content":""}"#)
            .replace(r#""finish_reason":null"#, r#""finish_reason":"stop""#),
    );
    s += &event(
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#,
    );
    s += "data: [DONE]\n\n";
    s
}

/// Everything a scan ends with, for comparing chunkings.
#[derive(Debug, PartialEq)]
struct Summary {
    first_token_event: Option<u32>,
    first_token_calls: usize,
    first_answer_event: Option<u32>,
    first_answer_calls: usize,
    reasoning_events: u32,
    reasoning_events_in_updates: u32,
    output_events: u32,
    output_events_in_updates: u32,
    events: u32,
    usage: Option<Usage>,
    done: bool,
    error: Option<String>,
}

fn scan(chunks: &[&[u8]]) -> Summary {
    let mut s = SseScanner::new();
    let mut updates: Vec<ScanUpdate> = chunks.iter().map(|c| s.feed(c)).collect();
    updates.push(s.finish());
    Summary {
        first_token_event: s.first_token_event(),
        first_token_calls: updates.iter().filter(|u| u.first_token).count(),
        first_answer_event: s.first_answer_event(),
        first_answer_calls: updates.iter().filter(|u| u.first_answer).count(),
        reasoning_events: s.reasoning_events(),
        reasoning_events_in_updates: updates.iter().map(|u| u.reasoning_events).sum(),
        output_events: s.output_events(),
        output_events_in_updates: updates.iter().map(|u| u.output_events).sum(),
        events: s.events(),
        usage: s.usage(),
        done: s.done(),
        error: s.error().map(str::to_owned),
    }
}

fn scan_whole(stream: &str) -> Summary {
    scan(&[stream.as_bytes()])
}

#[test]
fn vllm_stream_first_token_usage_done() {
    let got = scan_whole(&vllm_stream());
    assert_eq!(
        got,
        Summary {
            first_token_event: Some(1),
            first_token_calls: 1,
            first_answer_event: Some(1),
            first_answer_calls: 1,
            reasoning_events: 0,
            reasoning_events_in_updates: 0,
            output_events: 3,
            output_events_in_updates: 3,
            events: 7,
            usage: Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 3,
                cached_tokens: Some(8),
            }),
            done: true,
            error: None,
        }
    );
}

#[test]
fn first_token_is_reported_by_the_chunk_that_completes_it() {
    let stream = vllm_stream();
    let second_event = stream.match_indices("\n\n").nth(1).unwrap().0;
    let (a, b) = stream.as_bytes().split_at(second_event + 1);
    let mut s = SseScanner::new();
    let ua = s.feed(a);
    assert!(!ua.first_token, "the event's blank line has not arrived");
    let ub = s.feed(b);
    assert!(ub.first_token && ub.done);
    assert_eq!(ub.usage.unwrap().prompt_tokens, 12);
}

#[test]
fn byte_by_byte_equals_whole() {
    let stream = vllm_stream().replace('\n', "\r\n");
    let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
    assert_eq!(scan(&bytes), scan_whole(&stream));
    assert_eq!(scan(&bytes).first_token_event, Some(1));
}

#[test]
fn keep_alives_role_only_and_empty_values_are_not_output() {
    let mut stream = String::from(": ping\n\n:\n\n");
    stream += &event(&chat_chunk(
        r#"{"role":"assistant","content":"","refusal":null}"#,
    ));
    stream += &event(&chat_chunk(r#"{"content":null,"tool_calls":[]}"#));
    stream += &event(&chat_chunk(r#"{"reasoning_content":null,"reasoning":""}"#));
    // Generated text that mentions the key is escaped, so it is not a key.
    stream += &event(r#"{"choices":[{"delta":{"content":""}}],"x":"say \"content\":\"hi\""}"#);
    stream += "event: ping\n\n";
    let got = scan_whole(&stream);
    assert_eq!(
        (got.first_token_event, got.output_events, got.events),
        (None, 0, 4)
    );
}

#[test]
fn every_kind_of_output_counts() {
    for delta in [
        r#"{"content":"x"}"#,
        r#"{"content": "x"}"#,
        r#"{"reasoning_content":"thinking"}"#,
        r#"{"reasoning":"thinking"}"#,
        r#"{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}"#,
        r#"{"function_call":{"name":"f"}}"#,
    ] {
        let got = scan_whole(&event(&chat_chunk(delta)));
        assert_eq!(got.first_token_event, Some(0), "{delta}");
    }
    let completion = r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Once","logprobs":null,"finish_reason":null}]}"#;
    assert_eq!(scan_whole(&event(completion)).output_events, 1);
    let empty_text = r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#;
    assert_eq!(scan_whole(&event(empty_text)).output_events, 0);
}

#[test]
fn field_syntax_variants() {
    // No space after the colon, CRLF, and a data field split over two lines.
    let stream = "data:{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n\
                  id: 7\r\nretry: 100\r\ndata: {\"choices\":[{\"delta\":\r\ndata: {\"content\":\"hi\"}}]}\r\n\r\n\
                  data:[DONE]\n\n";
    let got = scan_whole(stream);
    assert_eq!(
        (got.first_token_event, got.events, got.done),
        (Some(1), 3, true)
    );
}

#[test]
fn error_events() {
    let openai = "event: error\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
    assert_eq!(scan_whole(openai).error.as_deref(), Some("overloaded"));
    let vllm =
        event(r#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#);
    assert_eq!(scan_whole(&vllm).error.as_deref(), Some("too long"));
    let plain = event(r#"{"error":"boom"}"#);
    assert_eq!(scan_whole(&plain).error.as_deref(), Some("boom"));
    let not_json = "event: error\ndata: upstream died\n\n";
    assert_eq!(scan_whole(not_json).error.as_deref(), Some("upstream died"));
    let finish_error = event(&chat_chunk(r#"{"content":"x"}"#).replace("null}", "\"error\"}"));
    assert_eq!(scan_whole(&finish_error).error, None);
}

#[test]
fn finish_flushes_an_unterminated_last_event() {
    let got = scan_whole("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]");
    assert_eq!((got.output_events, got.done, got.events), (1, true, 2));
}

#[test]
fn absurd_lines_are_truncated_and_bounded() {
    let huge = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(200 * 1024)
    );
    let stream = format!("{huge}{}", vllm_stream());
    let mut s = SseScanner::new();
    let mut max_buffered = 0;
    for chunk in stream.as_bytes().chunks(1000) {
        s.feed(chunk);
        max_buffered = max_buffered.max(s.buffered_bytes());
    }
    assert!(max_buffered <= MAX_LINE_BYTES, "{max_buffered}");
    assert_eq!(s.truncated_lines(), 1);
    assert_eq!(
        s.first_token_event(),
        Some(0),
        "the truncated head still shows content"
    );
    assert_eq!((s.output_events(), s.done()), (4, true));
    let chunks: Vec<&[u8]> = stream.as_bytes().chunks(1000).collect();
    assert_eq!(scan(&chunks), scan_whole(&stream));
}

#[test]
fn usage_of_a_complete_response() {
    let body = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
    let u = usage_from_body(body).unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        (9, 2, None)
    );
    let embeddings = br#"{"object":"list","data":[],"usage":{"prompt_tokens":5,"total_tokens":5}}"#;
    assert_eq!(usage_from_body(embeddings).unwrap().prompt_tokens, 5);
    assert_eq!(usage_from_body(b"{\"usage\":null}"), None);
    assert_eq!(usage_from_body(b"not json"), None);
}

#[test]
fn reasoning_comes_before_the_first_answer() {
    let mut stream = event(&chat_chunk(r#"{"role":"assistant","content":""}"#));
    for w in ["Let", " me", " think"] {
        stream += &event(&chat_chunk(&format!(
            r#"{{"reasoning_content":"{w}","content":null}}"#
        )));
    }
    stream += &event(&chat_chunk(r#"{"reasoning":"more"}"#));
    // Generated text that mentions a key is inside a string: still reasoning.
    stream += &event(&chat_chunk(r#"{"reasoning_content":"\"content\":\"x\""}"#));
    stream += &event(&chat_chunk(r#"{"content":"Yes"}"#));
    stream += &event(&chat_chunk(r#"{"content":"."}"#));
    stream += "data: [DONE]\n\n";
    let got = scan_whole(&stream);
    assert_eq!(got.first_token_event, Some(1));
    assert_eq!(got.first_answer_event, Some(6));
    assert_eq!((got.first_token_calls, got.first_answer_calls), (1, 1));
    assert_eq!(got.reasoning_events, 5);
    assert_eq!(got.output_events, 7);
    // Fed one byte at a time, the answer is reported by the chunk that completes it, once.
    let mut s = SseScanner::new();
    let bytes = stream.as_bytes();
    let answers: Vec<usize> = (0..bytes.len())
        .filter(|&i| s.feed(&bytes[i..i + 1]).first_answer)
        .collect();
    let end = stream.find(r#"{"content":"Yes"}"#).unwrap();
    let close = end + stream[end..].find("\n\n").unwrap() + 1;
    assert_eq!(answers, vec![close]);
}

#[test]
fn without_reasoning_the_first_answer_is_the_first_token() {
    let got = scan_whole(&vllm_stream());
    assert_eq!(got.first_answer_event, got.first_token_event);
    assert_eq!(got.reasoning_events, 0);
    // A tool call is an answer; a completion's text is an answer.
    let tool = event(&chat_chunk(
        r#"{"tool_calls":[{"index":0,"function":{"name":"f"}}]}"#,
    ));
    assert_eq!(scan_whole(&tool).first_answer_event, Some(0));
    let text = "data:{\"choices\":[{\"text\":\"t\"}]}\n\n";
    assert_eq!(scan_whole(text).first_answer_event, Some(0));
    // Reasoning alone never answers.
    let only = event(&chat_chunk(r#"{"reasoning_content":"hmm"}"#));
    let got = scan_whole(&only);
    assert_eq!(
        (got.first_token_event, got.first_answer_event),
        (Some(0), None)
    );
    assert_eq!(got.reasoning_events, 1);
}

// === property: chunking never changes the result ===

fn arb_event() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(event(&chat_chunk(r#"{"role":"assistant","content":""}"#))),
        "[a-z \"\\\\]{1,12}".prop_map(|w| {
            let content = serde_json::to_string(&w).unwrap();
            event(&chat_chunk(&format!(r#"{{"content":{content}}}"#)))
        }),
        Just(": keep-alive\n\n".to_string()),
        (0u32..5000, 0u32..500).prop_map(|(p, c)| event(&format!(
            r#"{{"choices":[],"usage":{{"prompt_tokens":{p},"completion_tokens":{c}}}}}"#
        ))),
        Just("data: [DONE]\n\n".to_string()),
        Just(event(&chat_chunk(r#"{"reasoning_content":"hmm"}"#))),
        Just(event(&chat_chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}"#
        ))),
        Just("data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"a\"}}]}\n\n".to_string()),
        Just("event: error\ndata: {\"error\":{\"message\":\"e\"}}\n\n".to_string()),
        Just("data:{\"choices\":[{\"text\":\"t\"}]}\n\n".to_string()),
    ]
}

proptest! {
    #[test]
    fn splitting_never_changes_the_result(
        events in prop::collection::vec(arb_event(), 0..30),
        crlf in any::<bool>(),
        mut cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let mut stream = events.concat();
        if crlf {
            stream = stream.replace('\n', "\r\n");
        }
        let bytes = stream.as_bytes();
        let mut at: Vec<usize> = cuts.drain(..).map(|i| i.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut chunks = Vec::new();
        let mut prev = 0;
        for a in at.into_iter().chain([bytes.len()]) {
            chunks.push(&bytes[prev..a]);
            prev = a;
        }
        let whole = scan(&[bytes]);
        prop_assert_eq!(whole.first_token_calls, usize::from(whole.first_token_event.is_some()));
        prop_assert_eq!(whole.output_events, whole.output_events_in_updates);
        prop_assert_eq!(whole.first_answer_calls, usize::from(whole.first_answer_event.is_some()));
        prop_assert_eq!(whole.reasoning_events, whole.reasoning_events_in_updates);
        // The first answer is never before the first token.
        prop_assert!(whole.first_answer_event >= whole.first_token_event || whole.first_answer_event.is_none());
        prop_assert_eq!(scan(&chunks), whole);
    }
}
