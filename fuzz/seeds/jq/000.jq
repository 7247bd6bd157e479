
        concurrency: 8
        default: []
        http:
          backend: vacancies
          path: 