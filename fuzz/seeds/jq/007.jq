 }
      topic:
        model: { name: topic_mlp, input: 