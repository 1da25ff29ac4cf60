# Operators' rules as the workload map's tests need them: a module of
# package partita.workload.custom, as an operator's ConfigMap would hold,
# whose rules answer only for the test inputs that ask for them.
package partita.workload.custom

rules contains {"name": "mine", "minMember": 2} if input.test == "one-rule"

rules contains {"name": "mine", "minMember": 2, "topology": {"preferred": "example.com/block"}} if input.test == "rule-topology"

rules contains {"name": "a", "minMember": 1} if input.test == "two-rules"

rules contains {"name": "b", "minMember": 1} if input.test == "two-rules"

disabled contains "batch/Job" if input.test == "disable-jobs"

kinds contains {"group": "example.com", "kind": "Trainer", "spec": true}
