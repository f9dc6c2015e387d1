//! Unit tests of the body parser's internals (keys, bounds, messages).

use super::*;

/// A body (`json!` sorts keys) with every ordering hazard: `messages` before
/// `model`, `tools` after `messages`, a message with `content` before `role`, escapes,
/// multi-part content and tool calls.
fn hazard_body(filler: &str) -> String {
    serde_json::json!({
        "messages": [
            {"role": "system", "content": format!("You are terse.\n{filler}")},
            {"content": [
                {"type": "text", "text": "look at \"this\": "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": filler},
            ], "role": "user"},
            {"content": null, "role": "assistant", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\":\"caf\u{e9}\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        ],
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
    })
    .to_string()
}

#[test]
fn chat_text_is_borrowed_then_written_once() {
    let body = hazard_body(&"plain words without escapes ".repeat(2000));
    let f = parse_fields(Endpoint::ChatCompletions, &body).unwrap();
    let span = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let in_body = |s: &str| {
        let start = s.as_ptr() as usize;
        span.contains(&start) && start + s.len() <= span.end
    };
    // Half one: nothing was copied at parse time; every text is a slice of the body.
    let messages = f.messages.as_deref().unwrap();
    let contents: Vec<Content<'_>> = messages
        .iter()
        .map(|m| Content::of(m.content).unwrap())
        .collect();
    let mut pieces = 0;
    for (m, c) in messages.iter().zip(&contents) {
        assert!(in_body(m.role.raw()));
        match c {
            Content::Empty => {}
            Content::Text(s) => {
                assert!(in_body(s.raw()));
                pieces += 1;
            }
            Content::Parts(parts) => {
                assert_eq!(parts.len(), 2, "only text parts are kept");
                for p in parts {
                    assert!(in_body(p.raw()));
                    pieces += 1;
                }
            }
        }
        for func in m.functions() {
            assert!(in_body(func.name.unwrap().raw()));
            assert!(in_body(func.arguments.unwrap().get()));
            pieces += 1;
        }
    }
    assert_eq!(pieces, 5);
    let tools = tools_text(f.tools).unwrap().unwrap();
    assert!(in_body(tools));

    // Half two: one allocation at the bound, never grown, so each byte is written once.
    let bound = chat_prompt_bound(Some(tools), messages, &contents);
    let mut prompt = String::with_capacity(bound);
    let (ptr, cap) = (prompt.as_ptr(), prompt.capacity());
    write_chat_prompt(Some(tools), messages, &contents, &mut prompt);
    assert_eq!((prompt.as_ptr(), prompt.capacity()), (ptr, cap));
    assert!(
        prompt.len() <= bound && bound - prompt.len() < 64,
        "bound is tight"
    );
    assert!(prompt.len() > 100_000);

    let features =
        parse_request_with_prompt(Endpoint::ChatCompletions, body.as_bytes(), None).unwrap();
    assert_eq!(features.prompt, prompt);
    assert!(features
        .prompt
        .starts_with("tools: [{\"function\":{\"name\":\"lookup\""));
    assert!(features
        .prompt
        .ends_with("assistant: lookup{\"q\":\"caf\u{e9}\"}\ntool: found\n"));
}

#[test]
fn unescaped_bodies_fill_the_bound_exactly() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi there"},
        {"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
    let f = parse_fields(Endpoint::ChatCompletions, body).unwrap();
    let messages = f.messages.as_deref().unwrap();
    let contents: Vec<_> = messages
        .iter()
        .map(|m| Content::of(m.content).unwrap())
        .collect();
    let bound = chat_prompt_bound(None, messages, &contents);
    let mut prompt = String::new();
    write_chat_prompt(None, messages, &contents, &mut prompt);
    assert_eq!(prompt, "user: hi there\nassistant: ab\n");
    assert_eq!(prompt.len(), bound);
}

#[test]
fn keys_are_read_only_on_their_endpoint() {
    use Endpoint::*;
    assert_eq!(Key::Messages.on(Completions), Key::Other);
    assert_eq!(Key::Prompt.on(ChatCompletions), Key::Other);
    assert_eq!(Key::Stream.on(Embeddings), Key::Other);
    assert_eq!(Key::MaxCompletionTokens.on(Completions), Key::Other);
    assert_eq!(Key::Input.on(Embeddings), Key::Input);
    assert_eq!(Key::User.on(Embeddings), Key::User);
}

#[test]
fn parser_messages_lose_their_position_suffix() {
    let e = serde_json::from_str::<u32>("\n  \"x\"").unwrap_err();
    assert_eq!(message_of(&e), "invalid type: string \"x\", expected u32");
}

#[test]
fn the_model_literal_is_located_in_the_body() {
    let body = hazard_body("x");
    let f = parse(Endpoint::ChatCompletions, body.as_bytes(), None, false).unwrap();
    let span = f.model_span.clone().unwrap();
    assert_eq!(&body[span], "\"m\"");
    // Escapes stay in the literal; the last of two `model` keys is the one read (as engines do).
    let body = r#"{"model":"first","prompt":"p","model" : "a\/b \"c\""}"#;
    let f = parse(Endpoint::Completions, body.as_bytes(), None, false).unwrap();
    assert_eq!(f.model, "a/b \"c\"");
    assert_eq!(&body[f.model_span.unwrap()], r#""a\/b \"c\"""#);
}
