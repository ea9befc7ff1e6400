"""A dense test reward: the fraction of the answer's digits found at the right place of the response; the count
of those digits comes back as an extra value (verl's dict result), which the generation dumps carry."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ans = str(ground_truth)
    hits = sum(1 for a, b in zip(solution_str, ans) if a == b)
    return {"score": hits / len(ans), "hits": hits}
