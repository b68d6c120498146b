"""Agents and their immutable versions."""

from __future__ import annotations

from flask import jsonify

from agentledger.agent_kinds import validate_definition
from agentledger.api import api
from agentledger.api.operations import READERS
from agentledger.api.request_scope import actor, state
from agentledger.api.requests import AgentBody, AgentVersionBody, ListQuery
from agentledger.api.responses import AgentList, AgentOut
from agentledger.core.errors import NotFound, ValidationFailed
from ingest.admin_log import record
from ingest.agents import AgentDefinition, add_agent_version, register_agent
from queries.agents_catalog import get_agent, list_agents

ADMIN = ("admin",)


def _definition(body: AgentBody) -> AgentDefinition:
    try:
        validate_definition(body.kind, body.params)
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from exc
    return AgentDefinition(name=body.name, kind=body.kind, model=body.model,
                           instructions=body.instructions, tools=body.tools, params=body.params)


def _read_agent(agent_id: str, *, after_write: bool = False):
    with state().db.read(primary=after_write) as s:
        return get_agent(s, agent_id)


@api.route("/agents", "POST", summary="Register an agent (version 1)", roles=ADMIN,
           body=AgentBody, responses={201: AgentOut}, errors=(409, 422), tag="agents")
def create_agent(body: AgentBody, raw_body):
    with state().db.write() as s:
        register_agent(s, body.id, _definition(body))
        record(s, actor(), "agent.registered", "agent", body.id, {"version": 1, "name": body.name})
    return jsonify(_read_agent(body.id, after_write=True)), 201


@api.route("/agents/<agent_id>", "PUT", summary="Add the next immutable version", roles=ADMIN,
           body=AgentVersionBody, responses={200: AgentOut}, errors=(404, 422), tag="agents")
def put_agent(agent_id: str, body: AgentVersionBody, raw_body):
    if body.id is not None and body.id != agent_id:
        raise ValidationFailed("id in the body must match the agent id in the path")
    with state().db.write() as s:
        version = add_agent_version(s, agent_id, _definition(body))
        record(s, actor(), "agent.versioned", "agent", agent_id, {"version": version,
                                                                  "name": body.name})
    return jsonify(_read_agent(agent_id, after_write=True))


@api.route("/agents", "GET", summary="List agents", query=ListQuery,
           roles=READERS, responses={200: AgentList}, tag="agents")
def agents_index(query: ListQuery):
    with state().db.read() as s:
        page = list_agents(s, limit=query.limit, cursor=query.cursor)
    return jsonify(page.as_dict())


@api.route("/agents/<agent_id>", "GET", summary="One agent with all its versions",
           roles=READERS, responses={200: AgentOut},
           errors=(404,), tag="agents")
def agent_detail(agent_id: str):
    agent = _read_agent(agent_id)
    if agent is None:
        raise NotFound(f"agent {agent_id} does not exist")
    return jsonify(agent)
