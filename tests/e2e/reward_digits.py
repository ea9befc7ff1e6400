"""A dense test reward: the fraction of the answer's digits found at the right place of the response. It returns
verl's dict result: the score, ``acc`` (1 for the whole answer, else 0: the validation's core metric) and the count
of digits found (an extra value, which the generation dumps and the val-aux metrics carry)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ans = str(ground_truth)
    hits = sum(1 for a, b in zip(solution_str, ans) if a == b)
    return {"score": hits / len(ans), "acc": float(solution_str.strip() == ans), "hits": hits}
