s product page: products + a mask (which attribute services a page needs) +
# recommendations (optional, short timeout) enriched with the recommendation mask