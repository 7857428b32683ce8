use super::*;

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// (parser, reply, its content, its calls).
fn samples() -> Vec<(ToolParser, &'static str, &'static str, Vec<ToolCall>)> {
    use ToolParser::*;
    let oslo = || call("get_weather", r#"{"city":"Oslo"}"#);
    vec![
        (
            Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            "Let me check.",
            vec![oslo()],
        ),
        (
            Hermes,
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>",
            "",
            vec![call("a", "{}"), call("b", r#"{"x":1}"#)],
        ),
        (Hermes, "<tool_call>{oops}</tool_call>", "<tool_call>{oops}</tool_call>", vec![]),
        (Hermes, " plain ", "plain", vec![]),
        (
            Llama3Json,
            r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#,
            "",
            vec![oslo()],
        ),
        (
            Llama3Json,
            r#"<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}"#,
            "",
            vec![call("a", "{}"), call("b", r#"{"x":1}"#)],
        ),
        (Llama3Json, "It is sunny.", "It is sunny.", vec![]),
        (Llama3Json, r#"{"name": "a", "par"#, r#"{"name": "a", "par"#, vec![]),
        (Llama3Json, r#"{"name": "a", "parameters": {}} and"#, r#"{"name": "a", "parameters": {}} and"#, vec![]),
        (
            Mistral,
            r#"Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]"#,
            "Sure.",
            vec![oslo()],
        ),
        (
            Mistral,
            r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[ARGS]{}"#,
            "",
            vec![oslo(), call("now", "{}")],
        ),
        (Mistral, "[TOOL_CALLS][{\"na", "[TOOL_CALLS][{\"na", vec![]),
        (Mistral, "No calls.", "No calls.", vec![]),
        (
            Pythonic,
            r#"[get_weather(city="Oslo"), now()]"#,
            "",
            vec![oslo(), call("now", "{}")],
        ),
        (
            Pythonic,
            "<|python_start|>[f(a='it\\'s', b=[1, -2.5, True, None], c={'k': (1,)},)]<|python_end|>",
            "",
            vec![call("f", r#"{"a":"it's","b":[1,-2.5,true,null],"c":{"k":[1]}}"#)],
        ),
        (Pythonic, "[1, 2]", "[1, 2]", vec![]),
        (Pythonic, "[f(x=1)] and more", "[f(x=1)] and more", vec![]),
        (Pythonic, "Hello.", "Hello.", vec![]),
    ]
}

#[test]
fn every_format_reads_its_calls_and_leaves_the_rest_as_content() {
    for (parser, text, content, calls) in samples() {
        let got = parser.parse(text);
        assert_eq!(
            (got.0.as_str(), &got.1),
            (content, &calls),
            "{parser:?} {text:?}"
        );
    }
    for name in ToolParser::NAMES {
        assert_eq!(ToolParser::from_name(name).unwrap().name(), name);
    }
    assert_eq!(ToolParser::from_name("granite"), None);
}

#[test]
fn calls_written_in_a_format_read_back_the_same() {
    let calls = vec![
        call("get_weather", r#"{"city":"Oslo \"N\""}"#),
        call("f", r#"{"n":[1,2.5,null,false],"o":{"k":"v"}}"#),
    ];
    for name in ToolParser::NAMES {
        let parser = ToolParser::from_name(name).unwrap();
        let text = parser.write(&calls);
        assert_eq!(
            parser.parse(&text),
            (String::new(), calls.clone()),
            "{text}"
        );
    }
    assert_eq!(
        ToolParser::Hermes.write(&calls[..1]),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo \\\"N\\\"\"}}\n</tool_call>"
    );
    assert_eq!(
        ToolParser::Pythonic.write(&calls[..1]),
        r#"[get_weather(city="Oslo \"N\"")]"#
    );
}
