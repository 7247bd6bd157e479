 }
      lr:
        model: { name: spam_lr, input: 