"""The fourth front end: `vmsandbox mcp`, tools for agents on the host over the Model Context Protocol (stdio, or
streamable HTTP on loopback), a thin layer over the core's one surface as the terminal, the page and the API are.
An agent makes and drives sessions, reads and writes their files, checkpoints, forks and reviews them; what
lands on the host is a person's choice, asked through the Person port (person.py), never the agent's.

- tools.py: what each tool does, over the core (core.sandbox.backend: the API's side of it, one implementation);
- person.py: the person's say on an agent's proposal (an MCP elicitation form of exactly that frozen review);
- shown.py: guest bytes as a model and a person read them (escaped, bounded);
- calls.py: how a tool's call runs (a worker thread, progress, cancel, failures in the client's words);
- page.py: the browser review a proposal opens for a client that cannot ask its person;
- server.py: the tools, resources and prompts registered with the MCP SDK (stdio is its own transport);
- propose.py: `propose_apply`, the proposal put to the person and what they took applied;
- kinds.py: what the tools' arguments and effects are called;
- loopback.py: streamable HTTP on 127.0.0.1, for this account only, with a key.

May import: vmsandbox.core and the foundation (errors, ui, paths…), and the `mcp` SDK.
"""
