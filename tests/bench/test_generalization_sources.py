"""The converters of ``scripts/generalization_sources.py``: each public transcript format (tau2-bench
results, ToolTalk conversations, SWE-agent and mini-swe-agent trajectories, Moatless Tools trees,
OpenHands integration-test mocks) becomes a rollout record that this project's trajectory loader
accepts, with its turns, tool calls and tool results where the source had them.

Every input is a small transcript written here in the shape of its source; nothing is read from
the sources' repositories.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from verl_credit.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generalization_sources", ROOT / "scripts" / "generalization_sources.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the module's dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


gs = _load_script()


def roles(record: dict[str, Any]) -> list[str]:
    return [m["role"] for m in record["messages"]]


def calls_of(trajectory: Trajectory) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for a in trajectory.actions for c in a.tool_calls]


def tool_sources(trajectory: Trajectory) -> list[tuple[str | None, int | None, int | None]]:
    """``(tool_call_id, source action, call position)`` of every tool result, in order."""
    return [(o.tool_call_id, o.source_action, o.call_position) for o in trajectory.observations if o.role == "tool"]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def test_text_flattens_none_strings_content_parts_and_objects() -> None:
    assert gs._text(None) == ""
    assert gs._text("plain") == "plain"
    assert gs._text([{"type": "text", "text": "first"}, "second", {"type": "image_url"}]) == "first\nsecond\n"
    assert gs._text({"alarm_id": "5bff-dd80"}) == '{"alarm_id": "5bff-dd80"}'
    assert gs._text(3) == "3"


def test_literal_parses_python_reprs_and_passes_other_values_through() -> None:
    assert gs._literal("[{'id': 'toolu_01', 'type': 'function'}]") == [{"id": "toolu_01", "type": "function"}]
    assert gs._literal("{'a': 1}") == {"a": 1}
    assert gs._literal("['call_1', 'call_2']") == ["call_1", "call_2"]
    assert gs._literal("ls -la") == "ls -la"
    already = [{"id": "x"}]
    assert gs._literal(already) is already
    assert gs._literal(None) is None
    assert gs._literal("[{'id': broken") is None  # not a repr: no value rather than an exception


# ---------------------------------------------------------------------------------------------
# tau2-bench
# ---------------------------------------------------------------------------------------------

AIRLINE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_reservation_details",
            "description": "Get the details of a reservation.",
            "parameters": {
                "type": "object",
                "properties": {"reservation_id": {"type": "string"}},
                "required": ["reservation_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_reservation",
            "description": "Cancel a reservation.",
            "parameters": {
                "type": "object",
                "properties": {"reservation_id": {"type": "string"}},
                "required": ["reservation_id"],
            },
        },
    },
]


def tau2_results() -> dict[str, Any]:
    return {
        "info": {
            "environment_info": {
                "domain_name": "airline",
                "policy": "You are an airline agent. Follow the cancellation policy.",
                "tool_defs": AIRLINE_TOOLS,
            },
            "agent_info": {"llm": "grok-3-mini"},
        },
        "simulations": [
            {
                "id": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                "task_id": "7",
                "trial": 2,
                "reward_info": {"reward": 1},
                "messages": [
                    {"role": "assistant", "content": "Hi! How can I help you today?", "turn_idx": 0},
                    {"role": "user", "content": "Please cancel reservation QX41B7.", "turn_idx": 1},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_a",
                                "name": "get_reservation_details",
                                "arguments": {"reservation_id": "QX41B7"},
                                "requestor": "assistant",
                            }
                        ],
                        "turn_idx": 2,
                    },
                    {
                        "role": "tool",
                        "id": "call_a",
                        "content": '{"reservation_id": "QX41B7", "status": "active"}',
                        "requestor": "assistant",
                        "error": False,
                        "turn_idx": 3,
                    },
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "call_b",
                                "name": "cancel_reservation",
                                "arguments": '{"reservation_id": "QX41B7"}',
                                "requestor": "assistant",
                            }
                        ],
                        "turn_idx": 4,
                    },
                    {
                        "role": "tool",
                        "id": "call_b",
                        "content": "Error: basic economy tickets cannot be cancelled",
                        "requestor": "assistant",
                        "error": True,
                        "turn_idx": 5,
                    },
                    {"role": "assistant", "content": "Sorry, this reservation cannot be cancelled.", "turn_idx": 6},
                ],
            },
            {
                "id": "9a8b7c6d-0000-1111-2222-333344445555",
                "task_id": "11",
                "messages": [
                    {"role": "assistant", "content": "Hello, what seems to be the problem?"},
                    {"role": "user", "content": "My phone has no signal."},
                    {"role": "assistant", "content": "Could you check your status bar?"},
                    {
                        "role": "user",
                        "content": None,
                        "tool_calls": [{"id": "u_1", "name": "check_status_bar", "arguments": {}, "requestor": "user"}],
                    },
                    {"role": "tool", "id": "u_1", "content": "No service", "requestor": "user"},
                    {"role": "user", "content": "It says no service."},
                ],
            },
        ],
    }


def test_tau2_records_convert_each_simulation_with_calls_results_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # tau2_records extends sys.path: undo it afterwards
    first, second = list(gs.tau2_records(tau2_results(), "tau2-grok/airline"))

    assert first["id"] == "tau2-grok/airline/7/2/0f1e2d3c"
    assert first["uid"] == "tau2-grok/airline/7"
    assert first["reward"] == 1.0
    assert first["domain"] == "airline"
    assert first["agent_llm"] == "grok-3-mini"
    assert first["tools"] == AIRLINE_TOOLS
    assert roles(first) == ["system", "assistant", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert first["messages"][0]["content"] == "You are an airline agent. Follow the cancellation policy."
    assert first["messages"][3]["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_reservation_details", "arguments": '{"reservation_id": "QX41B7"}'},
        }
    ]
    assert first["messages"][3]["content"] == ""
    assert first["messages"][5]["tool_calls"][0]["function"]["arguments"] == '{"reservation_id": "QX41B7"}'
    assert first["messages"][4] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": '{"reservation_id": "QX41B7", "status": "active"}',
    }
    assert first["messages"][6]["is_error"] is True

    trajectory = Trajectory.from_record(first)
    assert trajectory.num_actions == 4
    assert calls_of(trajectory) == [
        ("get_reservation_details", {"reservation_id": "QX41B7"}),
        ("cancel_reservation", {"reservation_id": "QX41B7"}),
    ]
    assert tool_sources(trajectory) == [("call_a", 1, 0), ("call_b", 2, 0)]
    assert trajectory.extra == {"tools": AIRLINE_TOOLS, "domain": "airline", "agent_llm": "grok-3-mini"}

    # no trial and no reward: trial 0, reward 0; the user's own phone check is not the agent's
    assert second["id"] == "tau2-grok/airline/11/0/9a8b7c6d"
    assert second["reward"] == 0.0
    assert roles(second) == ["system", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in second["messages"][3:]] == ["Could you check your status bar?", "It says no service."]
    second_trajectory = Trajectory.from_record(second)
    assert second_trajectory.num_actions == 2
    assert calls_of(second_trajectory) == []
    assert second_trajectory.observations[-1].source_action == 1  # the reply answers the question


def test_tau2_records_without_simulations_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert list(gs.tau2_records({"info": {}, "simulations": []}, "t")) == []
    (record,) = gs.tau2_records(
        {"simulations": [{"id": "abc", "task_id": "1", "messages": [{"role": "assistant", "content": "Hi"}]}]}, "t"
    )
    assert record["domain"] == "?"
    assert record["agent_llm"] is None
    assert "tools" not in record  # no schemas for an unknown domain
    assert roles(record) == ["assistant"]  # no policy: no system message
    assert Trajectory.from_record(record).num_actions == 1


# ---------------------------------------------------------------------------------------------
# ToolTalk
# ---------------------------------------------------------------------------------------------


def tooltalk_conversation() -> dict[str, Any]:
    return {
        "name": "AddAlarm-easy",
        "conversation_id": "90a1a217-55bc-4d6d-8b76-99440aae3a1a",
        "suites_used": ["Alarm", "Reminder"],
        "user": {"username": "justinkool", "session_token": "98a5a87a-7714-b404"},
        "metadata": {
            "location": "New York",
            "timestamp": "2023-09-11 13:00:00",
            "session_token": "98a5a87a-7714-b404",
            "username": "justinkool",
        },
        "conversation": [
            {"index": 0, "role": "user", "text": "I have class at 7 tonight. Set an alarm for 6:30 and remind me."},
            {
                "index": 1,
                "role": "assistant",
                "text": "I have set an alarm for 6:30 PM, but the reminder failed.",
                "apis": [
                    {
                        "request": {
                            "api_name": "AddAlarm",
                            "parameters": {"session_token": "98a5a87a-7714-b404", "time": "18:30:00"},
                        },
                        "response": {"alarm_id": "5bff-dd80"},
                        "exception": None,
                    },
                    {
                        "request": {"api_name": "AddReminder", "parameters": {"task": "class"}},
                        "response": None,
                        "exception": "Missing required parameter: due_date",
                    },
                ],
            },
            {"index": 2, "role": "user", "text": "Thanks, I'll take a quick nap."},
            {"index": 3, "role": "assistant", "text": "Sleep well!"},
        ],
    }


def test_tooltalk_record_turns_apis_into_calls_with_results_before_the_reply() -> None:
    record = gs.tooltalk_record(tooltalk_conversation(), "tooltalk")

    assert record["id"] == "tooltalk/AddAlarm-easy"
    assert record["uid"] == "tooltalk/AddAlarm-easy"
    assert record["reward"] == 1.0
    assert roles(record) == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert record["messages"][0]["content"] == (
        "You are a helpful assistant. The current time is 2023-09-11 13:00:00. The user's location is New York. "
        "The user is logged in as justinkool (session token 98a5a87a-7714-b404)."
    )
    assert record["messages"][3] == {"role": "tool", "tool_call_id": "call_0", "content": '{"alarm_id": "5bff-dd80"}'}
    assert record["messages"][5] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"error": "Missing required parameter: due_date"}',
        "is_error": True,
    }
    assert record["messages"][6] == {
        "role": "assistant",
        "content": "I have set an alarm for 6:30 PM, but the reminder failed.",
    }

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 4
    assert [a.content for a in trajectory.actions] == [
        "",
        "",
        "I have set an alarm for 6:30 PM, but the reminder failed.",
        "Sleep well!",
    ]
    assert calls_of(trajectory) == [
        ("AddAlarm", {"session_token": "98a5a87a-7714-b404", "time": "18:30:00"}),
        ("AddReminder", {"task": "class"}),
    ]
    assert [c.id for a in trajectory.actions for c in a.tool_calls] == ["call_0", "call_1"]
    assert tool_sources(trajectory) == [("call_0", 0, 0), ("call_1", 1, 0)]


def test_tooltalk_record_without_login_or_location_says_only_the_time() -> None:
    data = {
        "name": "RegisterUser-easy",
        "metadata": {"timestamp": "2023-09-11 09:00:00"},
        "conversation": [
            {"index": 0, "role": "user", "text": "Sign me up."},
            {
                "index": 1,
                "role": "assistant",
                "apis": [{"request": {"api_name": "RegisterUser"}, "response": {"session_token": "e149-636f"}}],
            },
        ],
    }
    record = gs.tooltalk_record(data, "tooltalk")
    assert record["messages"][0] == {
        "role": "system",
        "content": "You are a helpful assistant. The current time is 2023-09-11 09:00:00.",
    }
    assert roles(record) == ["system", "user", "assistant", "tool"]  # no text: no separate reply
    assert record["messages"][2]["tool_calls"][0]["function"] == {"name": "RegisterUser", "arguments": "{}"}
    trajectory = Trajectory.from_record(record)
    assert calls_of(trajectory) == [("RegisterUser", {})]
    assert tool_sources(trajectory) == [("call_0", 0, 0)]


# ---------------------------------------------------------------------------------------------
# SWE-agent
# ---------------------------------------------------------------------------------------------


def swe_agent_function_calling_traj() -> dict[str, Any]:
    return {
        "environment": "swe_main",
        "trajectory": [],
        "info": {"exit_status": "submitted"},
        "history": [
            {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "main"},
            {"role": "user", "content": "Demonstration: fix the demo bug.", "agent": "main", "is_demo": True},
            {"role": "assistant", "content": "Demo thought.", "agent": "main", "is_demo": True},
            {
                "role": "user",
                "content": [{"type": "text", "text": "<uploaded_files>\n/testbed\n</uploaded_files>"}],
                "agent": "main",
                "message_type": "observation",
            },
            {
                "role": "assistant",
                "content": "Let me look at the repository first.",
                "thought": "Let me look at the repository first.",
                "action": "ls /testbed",
                "agent": "main",
                "tool_calls": "[{'function': {'arguments': '{\"command\":\"ls /testbed\"}', 'name': 'bash'}, "
                "'id': 'toolu_01', 'type': 'function'}]",
                "message_type": "action",
            },
            {
                "role": "tool",
                "content": [{"type": "text", "text": "README.rst\nsrc"}],
                "agent": "main",
                "message_type": "observation",
                "tool_call_ids": "['toolu_01']",
            },
            {
                "role": "assistant",
                "content": "Now I open the schema module and submit.",
                "agent": "main",
                "tool_calls": [
                    {
                        "function": {
                            "arguments": '{"command": "view", "path": "/testbed/src/marshmallow/fields.py"}',
                            "name": "str_replace_editor",
                        },
                        "id": "toolu_02",
                        "type": "function",
                    },
                    {"function": {"name": "submit"}, "id": "toolu_03", "type": "function"},
                ],
                "message_type": "action",
            },
            {"role": "tool", "content": "class Field: ...", "agent": "main", "tool_call_ids": ["toolu_02"]},
            {"role": "tool", "content": "Submitted.", "agent": "main", "tool_call_id": "toolu_03"},
            {"role": "function", "content": "not a chat role", "agent": "main"},
        ],
    }


def test_swe_agent_record_parses_python_repr_tool_calls_and_drops_demonstrations() -> None:
    record = gs.swe_agent_record(swe_agent_function_calling_traj(), "swe-agent-fc/marshmallow-1867")

    assert record["id"] == "swe-agent-fc/marshmallow-1867"
    assert record["uid"] == "swe-agent-fc/marshmallow-1867"
    assert record["reward"] == 0.0
    assert roles(record) == ["system", "user", "assistant", "tool", "assistant", "tool", "tool"]
    assert "Demonstration" not in json.dumps(record["messages"])
    assert record["messages"][1]["content"] == "<uploaded_files>\n/testbed\n</uploaded_files>"
    assert record["messages"][2]["tool_calls"] == [
        {"id": "toolu_01", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls /testbed"}'}}
    ]
    assert record["messages"][3] == {"role": "tool", "content": "README.rst\nsrc", "tool_call_id": "toolu_01"}
    assert record["messages"][4]["tool_calls"][1]["function"] == {"name": "submit", "arguments": "{}"}
    assert [m.get("tool_call_id") for m in record["messages"][5:]] == ["toolu_02", "toolu_03"]

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 2
    assert calls_of(trajectory) == [
        ("bash", {"command": "ls /testbed"}),
        ("str_replace_editor", {"command": "view", "path": "/testbed/src/marshmallow/fields.py"}),
        ("submit", {}),
    ]
    assert tool_sources(trajectory) == [("toolu_01", 0, 0), ("toolu_02", 1, 0), ("toolu_03", 1, 1)]


def test_swe_agent_record_keeps_command_language_turns_as_text() -> None:
    data = {
        "history": [
            {"role": "system", "content": "You are an autonomous programmer.", "agent": "primary"},
            {"role": "user", "content": "We're currently solving the following issue.", "agent": "primary"},
            {
                "role": "assistant",
                "content": "DISCUSSION\nFirst I open the file.\n"
                "```\nopen src/pydicom/pixel_data_handlers/numpy_handler.py\n```",
                "thought": "DISCUSSION\nFirst I open the file.",
                "action": "open src/pydicom/pixel_data_handlers/numpy_handler.py",
                "agent": "primary",
                "tool_calls": None,
            },
            {"role": "user", "content": "[File: numpy_handler.py (100 lines total)]", "agent": "primary"},
            {"role": "assistant", "content": "```\nsubmit\n```", "agent": "primary"},
        ]
    }
    record = gs.swe_agent_record(data, "swe-agent-0x/pydicom__pydicom-1458")
    assert roles(record) == ["system", "user", "assistant", "user", "assistant"]
    assert all("tool_calls" not in m for m in record["messages"])
    assert record["messages"][2]["content"].endswith("```\nopen src/pydicom/pixel_data_handlers/numpy_handler.py\n```")

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 2
    assert calls_of(trajectory) == []
    assert [a.message_index for a in trajectory.actions] == [2, 4]


def test_swe_agent_record_of_a_trajectory_without_history_is_empty() -> None:
    record = gs.swe_agent_record({"trajectory": [{"action": "ls"}]}, "swe-agent-0x/empty")
    assert record == {"id": "swe-agent-0x/empty", "uid": "swe-agent-0x/empty", "reward": 0.0, "messages": []}
    assert Trajectory.from_record(record).num_actions == 0


# ---------------------------------------------------------------------------------------------
# mini-swe-agent
# ---------------------------------------------------------------------------------------------


def test_mini_swe_agent_record_converts_tool_call_trajectories() -> None:
    data = {
        "info": {"exit_status": "Submitted", "mini_version": "2.0.0"},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": [{"type": "text", "text": "<pr_description>Fix the parser.</pr_description>"}]},
            {
                "role": "assistant",
                "content": "I will look for the parser.",
                "tool_calls": [
                    {
                        "id": "call_00_a1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "grep -rn parse src/"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_00_a1", "content": "src/parser.py:3:def parse(text):"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_01_b2", "type": "function", "function": {"name": "bash"}}],
            },
            {"role": "tool", "tool_call_id": "call_01_b2", "content": "<returncode>0</returncode>"},
            {"role": "exit", "content": "Submitted", "extra": {"exit_status": "Submitted"}},
        ],
    }
    record = gs.mini_swe_agent_record(data, "mini-swe-agent-v2/astropy-12907")

    assert record["id"] == "mini-swe-agent-v2/astropy-12907"
    assert record["uid"] == "mini-swe-agent-v2/astropy-12907"
    assert record["reward"] == 0.0
    assert roles(record) == ["system", "user", "assistant", "tool", "assistant", "tool"]  # the exit entry dropped
    assert record["messages"][1]["content"] == "<pr_description>Fix the parser.</pr_description>"
    assert record["messages"][2]["tool_calls"] == [
        {
            "id": "call_00_a1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "grep -rn parse src/"}'},
        }
    ]
    assert record["messages"][4]["tool_calls"][0]["function"] == {"name": "bash", "arguments": "{}"}
    assert record["messages"][5] == {
        "role": "tool",
        "content": "<returncode>0</returncode>",
        "tool_call_id": "call_01_b2",
    }

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 2
    assert calls_of(trajectory) == [("bash", {"command": "grep -rn parse src/"}), ("bash", {})]
    assert tool_sources(trajectory) == [("call_00_a1", 0, 0), ("call_01_b2", 1, 0)]


def test_mini_swe_agent_record_keeps_bash_blocks_and_observations_of_text_trajectories() -> None:
    data = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Please solve this issue: the parser drops the last line."},
            {"role": "assistant", "content": "THOUGHT: look at the parser.\n\n```bash\ncat src/parser.py\n```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\ndef parse(text): ...\n</output>"},
            {
                "role": "assistant",
                "content": "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
            },
        ]
    }
    record = gs.mini_swe_agent_record(data, "mini-swe-agent-v1/django-11099")
    assert roles(record) == ["system", "user", "assistant", "user", "assistant"]
    assert all("tool_calls" not in m for m in record["messages"])
    assert record["messages"][2]["content"] == "THOUGHT: look at the parser.\n\n```bash\ncat src/parser.py\n```"

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 2
    assert calls_of(trajectory) == []
    assert [o.role for o in trajectory.observations] == ["system", "user", "user"]


# ---------------------------------------------------------------------------------------------
# Moatless Tools
# ---------------------------------------------------------------------------------------------


def moatless_trajectory() -> dict[str, Any]:
    return {
        "name": "MoatlessTools",
        "initial_message": "add ModelAdmin.get_inlines() hook to allow set inlines based on the request.",
        "current_transition_id": 4,
        "transitions": [
            {"id": 0, "name": "Pending"},
            {
                "id": 1,
                "name": "SearchCode",
                "previous_state_id": 0,
                "actions": [
                    {
                        "request": {
                            "scratch_pad": "Search the ModelAdmin class.",
                            "search_requests": [{"file_pattern": "django/contrib/admin/options.py"}],
                            "complete": False,
                        },
                        "response": {
                            "trigger": "did_search",
                            "output": {"ranked_spans": [{"span_id": "ModelAdmin.get_inline_instances", "rank": 0}]},
                        },
                    }
                ],
            },
            {
                "id": 2,
                "name": "PlanToCode",
                "previous_state_id": 1,
                "actions": [
                    {
                        "request": {
                            "scratch_pad": "Add the hook.",
                            "action": "modify",
                            "file_path": "django/contrib/admin/options.py",
                        },
                        "response": {"trigger": "retry", "retry_message": "Span ModelAdmin.foo not found."},
                    },
                    {
                        "request": {"action": "modify", "span_id": "ModelAdmin.get_inline_instances"},
                        "response": {"trigger": "edit_code", "output": "Applied the change."},
                    },
                ],
            },
        ],
    }


def test_moatless_record_turns_each_state_action_into_a_named_call_with_its_response() -> None:
    record = gs.moatless_record(moatless_trajectory(), "moatless/django__django-11095/trajectory")

    assert record is not None
    assert record["id"] == "moatless/django__django-11095/trajectory"
    assert record["uid"] == "moatless/django__django-11095/trajectory"
    assert record["reward"] == 0.0
    assert roles(record) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert record["messages"][1]["content"] == (
        "add ModelAdmin.get_inlines() hook to allow set inlines based on the request."
    )
    assert [m["content"] for m in record["messages"] if m["role"] == "assistant"] == [
        "Search the ModelAdmin class.",
        "Add the hook.",
        "",
    ]
    assert record["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": '{"ranked_spans": [{"span_id": "ModelAdmin.get_inline_instances", "rank": 0}]}',
    }
    assert record["messages"][5] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "Span ModelAdmin.foo not found.",
        "is_error": True,
    }
    assert record["messages"][7] == {"role": "tool", "tool_call_id": "call_2", "content": "Applied the change."}

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 3
    assert calls_of(trajectory) == [
        ("SearchCode", {"search_requests": [{"file_pattern": "django/contrib/admin/options.py"}], "complete": False}),
        ("PlanToCode", {"action": "modify", "file_path": "django/contrib/admin/options.py"}),
        ("PlanToCode", {"action": "modify", "span_id": "ModelAdmin.get_inline_instances"}),
    ]
    assert tool_sources(trajectory) == [("call_0", 0, 0), ("call_1", 1, 0), ("call_2", 2, 0)]


def test_moatless_record_does_not_change_its_input() -> None:
    data = moatless_trajectory()
    before = json.dumps(data, sort_keys=True)
    gs.moatless_record(data, "moatless/x")
    assert json.dumps(data, sort_keys=True) == before  # the scratch_pad is popped from a copy


@pytest.mark.parametrize(
    "data",
    [
        {"name": "MoatlessTools", "initial_message": "an issue"},
        {"transitions": {"0": {"name": "Pending"}}},
        {"transitions": []},
        {"transitions": [{"id": 0, "name": "Pending"}, {"id": 1, "name": "SearchCode", "actions": []}]},
    ],
    ids=["no-transitions", "transitions-not-a-list", "empty-transitions", "no-actions"],
)
def test_moatless_record_is_none_without_actions(data: dict[str, Any]) -> None:
    assert gs.moatless_record(data, "moatless/x") is None


# ---------------------------------------------------------------------------------------------
# OpenHands integration-test mocks
# ---------------------------------------------------------------------------------------------

SEPARATOR = "\n\n----------\n\n"

OPENHANDS_PROMPT = SEPARATOR.join(
    [
        "A chat between a curious user and an artificial intelligence assistant.",
        "Here is an example of how you can interact with the environment.\n--- END OF EXAMPLE ---\n\nNOW, LET'S START!",
        "Fix typos in bad.txt. Do not ask me for confirmation at any point.",
        "Let me look at the file.\n<execute_bash>\ncat bad.txt\n</execute_bash>",
        "OBSERVATION:\nThis is a stupid typoo.\nReally?\n[Command -1 finished with exit code 0]",
        "I will fix the typos.\n<execute_ipython>\nedit_file('bad.txt')\n</execute_ipython>",
        "Observation:\n[File updated.]\n\nENVIRONMENT REMINDER: You have 7 turns left to complete the task.",
    ]
)


def test_openhands_mock_record_splits_the_prompt_after_the_example() -> None:
    record = gs.openhands_mock_record(
        OPENHANDS_PROMPT + "\n", "The typos are fixed.\n<finish></finish>\n\n", "openhands-codeact/test_edits@1a2b3c4d"
    )

    assert record is not None
    assert record["id"] == "openhands-codeact/test_edits@1a2b3c4d"
    assert record["uid"] == "openhands-codeact/test_edits@1a2b3c4d"
    assert record["reward"] == 0.0
    assert roles(record) == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in record["messages"][1:]] == [
        "Fix typos in bad.txt. Do not ask me for confirmation at any point.",
        "Let me look at the file.\n<execute_bash>\ncat bad.txt\n</execute_bash>",
        "OBSERVATION:\nThis is a stupid typoo.\nReally?\n[Command -1 finished with exit code 0]",
        "I will fix the typos.\n<execute_ipython>\nedit_file('bad.txt')\n</execute_ipython>",
        "Observation:\n[File updated.]\n\nENVIRONMENT REMINDER: You have 7 turns left to complete the task.",
        "The typos are fixed.\n<finish></finish>",
    ]
    assert "END OF EXAMPLE" not in json.dumps(record["messages"])

    trajectory = Trajectory.from_record(record)
    assert trajectory.num_actions == 3
    assert calls_of(trajectory) == []
    assert [a.message_index for a in trajectory.actions] == [2, 4, 6]


def test_openhands_mock_record_of_a_first_prompt_is_the_task_and_the_response() -> None:
    prompt = SEPARATOR.join(["System text.", "NOW, LET'S START!", "Write hello.sh."])
    record = gs.openhands_mock_record(prompt, "<execute_bash>\necho hi > hello.sh\n</execute_bash>", "oh/t")
    assert record is not None
    assert roles(record) == ["system", "user", "assistant"]
    assert record["messages"][1]["content"] == "Write hello.sh."
    assert record["messages"][2]["content"] == "<execute_bash>\necho hi > hello.sh\n</execute_bash>"
    assert Trajectory.from_record(record).num_actions == 1


@pytest.mark.parametrize(
    "prompt",
    [
        SEPARATOR.join(["A system prompt without the start marker.", "Fix typos in bad.txt."]),
        SEPARATOR.join(["System text.", "Example.\n\nNOW, LET'S START!"]),
        "",
    ],
    ids=["no-start-marker", "nothing-after-the-marker", "empty"],
)
def test_openhands_mock_record_is_none_without_a_task_after_the_example(prompt: str) -> None:
    assert gs.openhands_mock_record(prompt, "<finish></finish>", "oh/t") is None


# ---------------------------------------------------------------------------------------------
# the validator rejects what a converter passes through unchecked
# ---------------------------------------------------------------------------------------------


def test_a_moatless_state_without_a_name_becomes_a_loadable_call() -> None:
    data = {"transitions": [{"id": 1, "actions": [{"request": {"scratch_pad": "?"}, "response": {"output": "x"}}]}]}
    record = gs.moatless_record(data, "moatless/nameless")
    assert record is not None
    assert record["messages"][2]["tool_calls"][0]["function"]["name"] == "unnamed_state"
    assert Trajectory.from_record(record).num_actions == 1


def test_tau2_records_add_the_scripts_folder_to_the_import_path_once() -> None:
    before = list(sys.path)
    try:
        for _ in range(3):
            list(gs.tau2_records({"simulations": []}, "tau2/none"))
        scripts = str(Path(gs.__file__).resolve().parent)
        assert sys.path.count(scripts) <= 1
    finally:
        sys.path[:] = before
