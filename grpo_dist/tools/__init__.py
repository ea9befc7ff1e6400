"""Tools for multi-turn rollouts, in verl's formats.

- ``schemas``: ``OpenAIFunctionToolSchema``, ``ToolResponse`` (verl's names and fields);
- ``base_tool``: ``BaseTool`` (``create`` / ``execute`` / ``calc_reward`` / ``release``);
- ``function_tool``: ``@function_tool`` and loading a file of them (``multi_turn.function_tool_path``);
- ``registry``: verl's tool config YAML (``multi_turn.tool_config_path``), ``verl.tools.`` read as ``grpo_dist.tools.``;
- ``calls``: ``run_tool_call``, what the agent loop calls: faults become error text for the model, counted;
- ``sandbox``: running Python in a limited child process group; ``sandbox_fusion_tools``: the code tool;
- ``gsm8k_tool``: verl's ``Gsm8kTool``.
"""
