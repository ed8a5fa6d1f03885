"""Row-wise operations on logits and scores: softmax."""
