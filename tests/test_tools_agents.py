"""The agent frameworks people use, as real clients of `multispec serve` over HTTP on Qwen2.5-Coder-0.5B-Instruct
(int8, CPU; the 1.5B with the 0.5B drafting for the Agents SDK's loop): the OpenAI Agents SDK running a two-tool
agent loop to its answer, LangChain's `ChatOpenAI(...).bind_tools(...)` (streamed and not) and pydantic-ai with
typed tools. Each test skips, saying why,
when the model file or its framework is absent (the test extra installs the frameworks)."""
from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow
pytest.importorskip("openai")
pytest.importorskip("uvicorn")

WEATHER = {"Paris": "sunny, 21 C", "Oslo": "rain, 9 C"}
ASK = "What is the weather in Paris? Then add 2 and 3."


class Place(BaseModel):
    """pydantic-ai's typed tool argument (at module level: the tool's annotations are looked up here)."""

    city: str = Field(description="the city's name")
    days: int = Field(ge=1, le=7, description="how many days ahead")


@pytest.fixture(scope="module")
def qwen():
    """`multispec serve` on Qwen2.5-Coder-0.5B-Instruct (its own chat template renders the tools), in a thread."""
    import real_models
    from test_serve import ServerThread

    from multispec.serve import ServeSettings, create_app

    pair = real_models.qwen_coder_small()
    s = ServerThread(create_app(pair, ServeSettings(model_name="qwen", method="lookup")))
    yield s
    s.close()


def _framework(module: str, package: str):
    return pytest.importorskip(module, reason=f"{package} is not installed (pip install -e '.[test]' brings it)")


@pytest.fixture(scope="module")
def qwen_large():
    """`multispec serve` on Qwen2.5-Coder-1.5B-Instruct (w4a8) with the 0.5B drafting (auto), in a thread: the 0.5B
    alone calls the same tool again on the loop's second turn."""
    import real_models
    from test_serve import ServerThread

    import multispec
    from multispec.serve import ServeSettings, create_app

    target, draft = real_models.qwen_coder()
    pair = multispec.load_pair(target=str(target), draft=str(draft), dtype="w4a8", device="cpu")
    s = ServerThread(create_app(pair, ServeSettings(model_name="qwen", method="auto")))
    yield s
    s.close()


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_agents_sdk_runs_a_two_tool_loop_to_its_answer(qwen_large, stream):
    agents = _framework("agents", "the OpenAI Agents SDK (openai-agents)")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # nothing to send traces to
    called: list[tuple] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        called.append(("get_weather", city))
        return WEATHER.get(city, "unknown")

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        called.append(("add", a, b))
        return a + b

    client = AsyncOpenAI(base_url=qwen_large.url + "/v1", api_key="none", max_retries=0, timeout=600)
    # Every turn must call a tool (tool_choice required, not reset after a call) and the loop ends at `add`, whose
    # result is the answer: the model makes one call a turn and, left to choose (auto), writes its second call as
    # bare JSON outside the <tool_call> envelope its template asks for (text, not a call)
    agent = agents.Agent(
        name="helper", instructions="Answer with the tools. Call every tool you need, then answer in one sentence.",
        tools=[get_weather, add], model=agents.OpenAIChatCompletionsModel(model="qwen", openai_client=client),
        model_settings=agents.ModelSettings(temperature=0, tool_choice="required", max_tokens=120),
        reset_tool_choice=False, tool_use_behavior=agents.StopAtTools(stop_at_tool_names=["add"]))
    async def run():
        if not stream:
            return await agents.Runner.run(agent, ASK, max_turns=5)
        streamed = agents.Runner.run_streamed(agent, ASK, max_turns=5)
        async for _ in streamed.stream_events():
            pass
        return streamed

    result = asyncio.run(run())
    assert {c[0] for c in called} == {"get_weather", "add"}, called  # the loop called both tools
    assert ("get_weather", "Paris") in called and ("add", 2, 3) in called, called
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(outputs) == len(called)  # each result went back to the model (as a role "tool" message)
    assert str(result.final_output) == "5", result.final_output  # the loop's answer: add's result


def test_langchain_bind_tools_returns_calls_whose_args_validate(qwen):
    _framework("langchain_openai", "LangChain (langchain-openai)")
    from langchain_core.messages import AIMessageChunk
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for the next few days."""
        return WEATHER.get(city, "unknown")

    @tool
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        return a + b

    llm = ChatOpenAI(model="qwen", base_url=qwen.url + "/v1", api_key="none", temperature=0, max_tokens=100,
                     max_retries=0, timeout=600)
    tools = {"get_weather": get_weather, "add": add}
    named = llm.bind_tools(list(tools.values()), tool_choice="get_weather")
    msg = named.invoke("What is the weather in Paris for the next 3 days?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg
    assert get_weather.args_schema.model_validate(msg.tool_calls[0]["args"]).city == "Paris"
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    streamed = None  # under required, streamed: the chunks add up to one call that validates
    one = llm.bind_tools(list(tools.values()), tool_choice="required", parallel_tool_calls=False)
    for chunk in one.stream("Add 2 and 3."):
        assert isinstance(chunk, AIMessageChunk)
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.tool_calls and not streamed.invalid_tool_calls, streamed
    for c in streamed.tool_calls:
        tools[c["name"]].args_schema.model_validate(c["args"])
    assert [{"name": c["name"], "args": c["args"]} for c in streamed.tool_calls] == [{"name": "add",
                                                                                      "args": {"a": 2, "b": 3}}]
    assert streamed.response_metadata["finish_reason"] == "tool_calls"


def test_pydantic_ai_calls_a_typed_tool(qwen):
    _framework("pydantic_ai", "pydantic-ai (pydantic-ai-slim[openai])")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from pydantic_ai.capabilities import AbstractCapability

    class ToolFirst(AbstractCapability):
        """tool_choice required on the run's first step: under auto the 0.5B model writes its call as text, without
        the <tool_call> tags its template asks for."""

        def get_model_settings(self):
            return lambda ctx: {"tool_choice": "required"} if ctx.run_step <= 1 else {}

    model = OpenAIChatModel("qwen", provider=OpenAIProvider(base_url=qwen.url + "/v1", api_key="none"))
    agent = Agent(model, instructions="Use the get_weather tool, then answer in one sentence.",
                  model_settings={"temperature": 0, "max_tokens": 120, "parallel_tool_calls": False},
                  capabilities=[ToolFirst()])
    called: list[Place] = []

    @agent.tool_plain
    def get_weather(place: Place) -> str:
        """The weather in a city for the next few days."""
        called.append(place)
        return WEATHER.get(place.city, "unknown")

    result = agent.run_sync("What is the weather in Paris for the next 3 days?")
    assert called == [Place(city="Paris", days=3)], called  # the arguments validated into the typed model
    assert isinstance(result.output, str) and result.output.strip(), result.output
