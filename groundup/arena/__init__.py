"""`groundup arena`: models answer the same prompts, a judge (or people, on the chat page) picks the better
answer, and Bradley-Terry ratings with bootstrap intervals come out, as FastChat's Chatbot Arena computes them."""
