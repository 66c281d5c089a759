"""Credit assignment: turn scores (rewards), discounted returns, group advantages and the Sample record.

Below the learner and above the evaluator: it reads verdicts and trajectories and produces the samples
the learner trains on, so neither the learner nor the trainer needs the policy records to do it.
"""
