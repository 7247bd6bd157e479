
        model: { name: spam_gbdt, input: 