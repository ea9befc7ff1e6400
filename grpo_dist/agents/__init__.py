"""Agent loops (verl's ``rollout.mode=async`` rollouts): one coroutine per trajectory.

- ``settings``: ``AgentSettings``, what a run's agent loops read from its configuration;
- ``base``: ``AgentLoopOutput``, ``AgentLoopBase``, ``register`` / ``get_agent_loop_class``,
  ``load_agent_loop_config`` (verl's YAML of user loops);
- ``single_turn``: ``single_turn_agent``; ``tool_agent``: ``tool_agent`` (hermes tool calls);
- ``runner``: ``run_trajectories``, every trajectory of a batch at once, prompt-major.
"""
