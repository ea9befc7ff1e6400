"""A process reward for the tests: each line (step) scores 1 if it starts with a digit, else 0."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    lines = solution_str.splitlines(keepends=True)
    steps = [1.0 if line.strip()[:1].isdigit() else 0.0 for line in lines]
    return {"score": sum(steps) / max(len(steps), 1), "step_rewards": steps}
