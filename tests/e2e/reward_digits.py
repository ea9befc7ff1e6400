"""A dense test reward: the fraction of the answer's digits found at the right place of the response."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ans = str(ground_truth)
    hits = sum(1 for a, b in zip(solution_str, ans) if a == b)
    return hits / len(ans)
